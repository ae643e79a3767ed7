"""The engine's real-time policy: each stream's playout clock, the deadline policy that orders
and sizes the scheduler's work by it, the start-up calibration of step time (and its
consistency checks) and its online correction, the probes an idle engine runs when admission
asks, and the step telemetry the edge reads.

======================  ======================================================================
module                  what it holds
======================  ======================================================================
``playout_clock``       when each chunk of a stream is due, and its slack
``deadline_policy``     earliest-deadline order, skipped steps, prefill sizes, when to rest
``plan``                the :class:`RealtimePlan` the engine announces (chunks in its frames)
``calibration``         the start-up sweep that fits the step-time model
``calibration_cache``   the sweep's cache key (model, device, settings, native kernels)
``calibration_checks``  whether a sweep agrees with itself; the conservative fallback
``remeasure``           measuring again, once idle, after a conservative start
``arrival_waves``       waves of simultaneous arrivals, measured through their first chunks
``probe``               idle steps measured on admission's request
``synthetic_streams``   the streams the calibration and the probes run
``step_correction``     measured over predicted step time, online
``step_telemetry``      every step and chunk, for the edge's reports and the correction
======================  ======================================================================

The engine owns every duration here and announces it; the edge's admission reads what it was
told (docs/capacity.md has the whole model).
"""
