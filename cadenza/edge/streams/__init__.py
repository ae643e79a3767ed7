"""Streams and sessions as every transport shares them: no client I/O here, the transports do it.

``lease`` (one admission sequence and stream lifecycle for HTTP, WebSocket and WebRTC),
``speak_session`` (the WebSocket/WebRTC session rules), ``protocol`` (the WebSocket protocol's
messages), ``conversation`` (the turns a conversational model hears), ``microphone``
(microphone audio for speech prompts), ``utterance_tasks`` (the utterances a session plays, a
task each), ``sampling_fields`` (the sampling extensions every speech request accepts),
``untrusted_json`` (one JSON policy for every surface) and ``errors`` (:class:`EdgeError`,
rendered by every transport).
"""
