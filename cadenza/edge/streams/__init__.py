"""Streams and sessions as every transport shares them: no client I/O here, the transports do it.

``admission_sequence`` (the one admission sequence for HTTP, WebSocket and WebRTC) and
``lease`` (a stream's lifecycle after it, and its resume on another replica),
``utterance_opening`` (a session's ``speak`` admitted), ``speak_session`` (the
WebSocket/WebRTC session rules), ``utterance_tasks`` (the utterances a session plays, a task
each), ``protocol`` (the WebSocket protocol's messages), ``text_segmenter`` and ``text_stream``
(text that arrives while it plays, cut into segments on one lease), ``conversation`` (the turns
a conversational model hears), ``microphone`` (microphone audio for speech prompts),
``checkpoints``, ``checkpoint_seal``, ``resume_token`` and ``stream_resume`` (streams kept in
Redis, sealed, and resumed on any node, docs/scaling.md), ``sampling_fields`` (the sampling
extensions every speech request accepts), ``untrusted_json`` (one JSON policy for every
surface) and ``errors`` (:class:`EdgeError`, rendered by every transport).
"""
