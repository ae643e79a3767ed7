"""Load-test harness: real clients against a running server, capacity at SLO.

``cadenza loadtest`` (see :mod:`cadenza.loadtest.harness`) offers streams over WebSocket, HTTP
or WebRTC (:mod:`~cadenza.loadtest.clients`) by an arrival process
(:mod:`~cadenza.loadtest.level_runner`), simulates each listener's playout
(:mod:`~cadenza.loadtest.playout`), summarizes each level
(:mod:`~cadenza.loadtest.level_summary`), sweeps for capacity (:mod:`~cadenza.loadtest.sweep`)
and writes the report (:mod:`~cadenza.loadtest.report`).
"""
