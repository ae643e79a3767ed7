"""The transports: the I/O that carries a stream to a client, one module per way in, and what
only one of them needs.

``speech_http`` (``POST /v1/audio/speech`` and ``GET /v1/models``), ``websocket``
(``WS /v1/stream``), ``webrtc`` (``POST /v1/webrtc/offer``: aiortc peers, a paced track, the
control channel), ``http_io`` (bounded, timed request bodies and streamed responses),
``http_protocol`` (uvicorn's h11 protocol with a request-head deadline), ``ws_protocol``
(uvicorn's WebSocket protocol, text that is not UTF-8 a client's fault) and ``jitter_buffer``
(WebRTC's playout buffer). What they share is in :mod:`cadenza.edge.streams`.
"""
