"""The engine's real-time policy: each stream's playout clock, the deadline policy that orders
and sizes the scheduler's work by it, the start-up calibration of step time (and its
consistency checks) and its online correction, the probes an idle engine runs when admission
asks, and the step telemetry the edge reads."""
