"""Python SDK over the WebSocket protocol.

Not built yet; it arrives with the real-time edge.
"""
