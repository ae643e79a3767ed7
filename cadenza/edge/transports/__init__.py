"""The transports: the I/O that carries a stream to a client, one module per way in, and what
only one of them needs.

``speech_http`` (``POST /v1/audio/speech`` and ``GET /v1/models``), ``websocket``
(``WS /v1/stream``) with ``ws_payloads`` (its binary audio per format) and
``listener_estimate`` (what its listener heard, for ``done``), ``webrtc`` (aiortc peers and
their control channel) with ``webrtc_offer`` (``POST /v1/webrtc/offer``, ``GET
/v1/webrtc/config``), ``webrtc_ice`` (STUN/TURN, an announced address), ``paced_track`` (20 ms
frames on the wall clock) and ``jitter_buffer`` (its playout buffer), ``http_io`` (bounded,
timed request bodies and streamed responses), ``http_protocol`` (uvicorn's h11 protocol with a
request-head deadline) and ``ws_protocol`` (uvicorn's WebSocket protocol, text that is not
UTF-8 a client's fault). What they share is in :mod:`cadenza.edge.streams`; docs/protocol.md
documents every message and error code.
"""
