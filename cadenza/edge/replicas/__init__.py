"""The served models' engine replicas and their supervision.

``model_service`` (one served model: its replicas, capacity, admission and metrics),
``replica`` (one engine process, supervised: started, watched, started again) and
``restart_policy`` (when to restart a lost engine, and when to stop trying).

Each served model runs on ``supervision.replicas`` engine processes (``--replicas N``), each
with its own KV pool and calibration, behind one admission gate
(:mod:`cadenza.edge.admission.gate`). On a machine with several GPUs replica ``i`` takes GPU
``i mod count``; on the CPU the replicas divide the cores
(:mod:`cadenza.contract.cpu_replicas`: pinned blocks where there are at least as many cores as
replicas, else all sharing every core), and nodes on one host divide the host's cores first
(docs/scaling.md, "Nodes on one host"). Unset, ``supervision.replicas`` is one per core for the
batching engine in its own processes on a CPU-only machine of at most two cores, one elsewhere.
A model's replicas start together and calibrate side by side, so each measures its steps while
the others work, as in service; the calibration cache is keyed by how many replicas measured
together.

A lost replica is restarted with backoff (``cadenza_engine_crashes_total``,
``cadenza_engine_restarts_total``, ``cadenza_engine_time_to_ready_seconds``,
``cadenza_engine_replicas{state}``); with ``supervision.warm_spare`` a second loaded engine
takes over at once. Its streams are not lost: each lease asks the gate for another replica and
sends its request again with a ``ResumePoint`` (the rows generated, the frames heard); the
engine replays them (a seeded stream's generator too) and goes on from the next row, the codec
fed the last ``supervision.resume_replay_ms`` of heard audio so the waveform continues. The
listener hears a gap (``cadenza_stream_resumes_total{outcome}``,
``cadenza_stream_resume_gap_seconds``); a stream no replica takes within
``server.resume_timeout_s`` fails with 503 ``engine_unavailable``.
"""
