"""The edge process: everything between clients and the engine, in asyncio, without torch.

Its modules are grouped by role, one sub-package each:

==================  ==========================================================================
sub-package         what it holds
==================  ==========================================================================
``server/``         the HTTP application and its life cycle: ``app`` (routes, lifespan, health,
                    the browser page in ``static/``), ``state``, ``lifecycle`` (drain),
                    ``draining_server`` (uvicorn, SIGTERM as a drain), ``admin`` (operator
                    routes), ``metrics`` (Prometheus), ``lazy_modules`` (imports at start)
``transports/``     the I/O of each way in: ``speech_http`` (``POST /v1/audio/speech``),
                    ``websocket`` (``WS /v1/stream``), ``webrtc`` (``POST /v1/webrtc/offer``),
                    ``http_io`` (bounded bodies), ``http_protocol`` (request-head deadline),
                    ``ws_protocol`` (text that is not UTF-8 is the client's fault),
                    ``jitter_buffer`` (WebRTC playout)
``streams/``        what every transport shares: ``lease`` (one admission sequence
                    and stream lifecycle), ``speak_session`` (session rules), ``protocol``
                    (WebSocket messages), ``conversation``, ``microphone``, ``utterance_tasks``,
                    ``sampling_fields``, ``untrusted_json`` (one JSON policy), ``errors``
                    (:class:`EdgeError`)
``replicas/``       engine replicas and their supervision: ``model_service`` (one served
                    model), ``replica`` (one supervised engine process), ``restart_policy``
``admission/``      keys, validation, guard, rate limits, capacity, queues
``media/``          PyAV: containers, Opus packets, resampling, tempo, WAV
==================  ==========================================================================

Nothing here imports torch or the engine's modules (``make lint`` enforces it): a model step
or a slow import must not stall the event loop that paces audio.
"""
