"""Load-test harness: real clients against a running server, capacity at SLO.

Not built yet; it arrives with its own issue.
"""
