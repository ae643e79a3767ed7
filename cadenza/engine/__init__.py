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
``kv/``             paged KV tensors, the page pool and prefix cache, the KV cache manager
``realtime/``       playout clocks, the deadline policy, calibration, step-time correction,
                    step telemetry
``layouts/``        how tokens spell codec frames (plain, flat, parallel+delay)
``models/``         model families, checkpoints, the registry
==================  ==========================================================================

Everything here imports torch and runs only in the engine process (or in a caller that runs
the engine itself: tests, ``cadenza generate``, ``cadenza bench``).
"""
