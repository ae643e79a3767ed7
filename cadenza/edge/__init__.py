"""The edge process: everything between clients and the engine, in asyncio, without torch.

Its modules are grouped by role, one sub-package each:

==================  ==========================================================================
sub-package         what it holds
==================  ==========================================================================
``server/``         the HTTP application and its life cycle: routes, health and readiness,
                    drain, operator routes, Prometheus metrics, HAProxy's agent check, the
                    node's name, the browser page in ``static/``
``transports/``     the I/O of each way in: OpenAI HTTP, WebSocket, WebRTC (offer, ICE, paced
                    track, jitter buffer), bounded bodies, the HTTP and WebSocket protocols
``streams/``        what every transport shares, without client I/O: the admission sequence
                    and its lease, session rules, the WebSocket protocol, text streamed in,
                    conversations, microphone audio, checkpoints and resumes, one JSON policy,
                    one error type (:class:`EdgeError`)
``replicas/``       engine replicas and their supervision
``admission/``      validation, guard, rate limits, capacity, queues, the gate
``auth/``           who is calling: stream and admin keys, client tokens, origins, failed
                    attempts (docs/security.md)
``media/``          PyAV: containers, Opus packets, resampling, tempo, WAV
==================  ==========================================================================

Rules every transport shares, each in one place:

* **One judge of credentials.** ``auth/authenticator.py`` turns what a client presents (a
  key, a client token, nothing on an open server) into a ``Principal``, the only thing a
  transport hands admission about who is asking; admission applies its scope.

* **One admission lease.** ``streams/admission_sequence.py`` and ``streams/lease.py`` are the
  only places a stream is admitted and ended: the same refusal order, the same costs (a guard
  refusal charges nothing; a capacity refusal refunds the rate-limit charge) and the same
  metrics, labelled by transport: ``cadenza_stream_requests_total``,
  ``cadenza_stream_refusals_total{code}``, ``cadenza_time_to_first_audio_seconds``,
  ``cadenza_audio_seconds_total`` (what the engine produced, which also settles the
  audio-seconds bucket) and ``cadenza_streams_finished_total{reason}``.
* **One speak session.** ``streams/speak_session.py`` holds the WebSocket and WebRTC control
  rules without I/O; the endpoints feed it messages and carry out the events it returns.
* **One input policy.** Every JSON a client sends is decoded by ``streams/untrusted_json.py``;
  bodies are capped and timed (``transports/http_io.py``), request heads must arrive within
  ``server.request_head_timeout_s`` (``transports/http_protocol.py``). A client that hangs up,
  or sends a WebSocket text message that is not UTF-8, is logged as an event, never a
  traceback.
* **Clients that stop reading.** Every send is bounded by ``server.send_timeout_s``; a client
  whose connection takes nothing for that long, or whose queue of ``server.max_queued_chunks``
  chunks fills, is dropped, and its stream's slot is freed first.

Nothing here imports torch or the engine's modules (``make lint`` enforces it): a model step
or a slow import must not stall the event loop that paces audio.
"""
