"""The engine process: one copy of the weights, many streams, one forward pass per step.

==================  ==========================================================================
where               what
==================  ==========================================================================
``engine``          the step: schedule -> run -> postprocess -> audio
``builder``         an engine from a model name or the configuration (and, calibrated, for
                    the engine process)
``request_intake``  a request becomes a sequence
``sequence``        a request's state
``scheduler``       which sequences advance, and every change to them after a step
``model_runner``    one flattened forward pass and the sampled rows
``sampler``         batched sampling with per-request seeds
``audio_stage``     codec slots, the batched streaming decode, outputs
``chunk_policy``    which streams decode in a step
``identity``        the engine as the edge sees it (``EngineInfo``)
``offline``         token ids and whole utterances without a server
``device``          device, dtypes, free memory
``naive_engine``    the baseline a load test compares against
``precision``       which dtypes the engine computes in (named, or chosen by ``auto``)
``serving_engine``  what the engine process's loop drives (this engine, the naive baseline)
``kv/``             paged KV tensors, the page pool and prefix cache, the KV cache manager
``realtime/``       playout clocks, the deadline policy, calibration, idle probes, step-time
                    correction, step telemetry
``layouts/``        how tokens spell codec frames (plain, flat, parallel+delay, frames; a
                    family's own, Bark's, with contexts that restart)
``models/``         model families, checkpoints, the registry
==================  ==========================================================================

The modules import in one direction (``tests/unit/engine/test_engine_imports.py``, with
``TYPE_CHECKING`` imports counted): what drives an :class:`Engine` from outside (offline use,
idle probes, the calibration) is a module function over it, and the announcement the edge reads
is computed from the parts by the builder, so ``engine`` imports none of them. Only
``Engine.from_pretrained``/``from_config`` reach the builder back, lazily, as constructors must.

Everything here imports torch and runs only in the engine process (or in a caller that runs
the engine itself: tests, ``cadenza generate``, ``cadenza bench``).
"""
