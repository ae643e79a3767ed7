"""The edge process: everything between clients and the engine, in asyncio, without torch.

==================  ==========================================================================
module              what it does
==================  ==========================================================================
``app``             the FastAPI app: routes, lifespan (starts the engine), health, metrics
``state``           what the handlers share (configuration, engine client, admission)
``model_service``   one served model: its engine replicas, capacity, admission and metrics
``replica``         one supervised engine replica: started, watched, started again
``restart_policy``  when to restart a lost engine, and when to stop trying
``lifecycle``       whether the server takes new streams (drain), and the ones it has open
``draining_server`` the HTTP server process: uvicorn, with SIGTERM turned into a drain
``admin``           operator routes: drain, restart a model's replicas, list replicas
``lazy_modules``    what the web stack would import on a first request, imported at start
``lease``           one admission sequence and stream lifecycle for every transport
``speech_http``     ``POST /v1/audio/speech`` (OpenAI) and ``GET /v1/models``
``websocket``       ``WS /v1/stream``: the I/O around a speak session
``webrtc``          ``POST /v1/webrtc/offer``: aiortc peers, paced track, control channel
``speak_session``   the WebSocket/WebRTC session rules, without I/O
``conversation``    a session's conversation: the turns a conversational model hears
``sampling_fields`` the sampling extensions every speech request accepts, validated
``protocol``        the WebSocket protocol's messages, without I/O
``untrusted_json``  one JSON decoding policy for every surface
``http_io``         bounded, timed request bodies and streamed responses
``http_protocol``   the HTTP server protocol with a request-head timeout
``utterance_tasks`` the utterances a session plays, one task each
``jitter_buffer``   WebRTC playout buffer
``microphone``      microphone audio for speech prompts
``errors``          :class:`EdgeError`, rendered by every transport
``metrics``         Prometheus metrics
``admission/``      keys, validation, guard, rate limits, capacity, queues
``media/``          PyAV: containers, Opus packets, resampling, tempo, WAV
==================  ==========================================================================

Nothing here imports torch or the engine's modules (``make lint`` enforces it): a model step
or a slow import must not stall the event loop that paces audio.
"""
