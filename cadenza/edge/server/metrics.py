"""Prometheus metrics of the edge process. The engine reports its step times and counters to
the edge in ``stats`` messages, so one ``/metrics`` endpoint shows both sides.

Engine and admission metrics carry a ``model`` label (each served model has its own engine
and admission); :class:`~cadenza.edge.server.model_metrics.ModelMetrics` is one model's view of
them, summed over the model's engine replicas. Stream and transport metrics are the edge's,
across models."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
_STEP_BUCKETS_S = (0.001, 0.002, 0.004, 0.008, 0.0133, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
# Delays that should be a millisecond or two; from 0.1 s on (``cadenza.loop_lag.STALL_S``) a
# delay has held audio as long as a client's buffer.
_STALL_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """All server metrics, on a registry of their own (one per app, so tests can build many)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "cadenza_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.quota_shared = Gauge(
            "cadenza_quota_shared",
            "1 while the rate limits are the fleet's (Redis answers), 0 while this node's own "
            "or refusing (limits.redis_failure); absent without limits.redis_url",
            registry=r,
        )
        self.quota_redis_failures = Counter(
            "cadenza_quota_redis_failures",
            "round trips to the rate limits' Redis that failed (refused, timed out, an error)",
            registry=r,
        )
        self.checkpoint_writes = Counter(
            "cadenza_checkpoint_writes",
            "round trips that wrote streams' resume checkpoints to Redis (limits.redis_url)",
            registry=r,
        )
        self.checkpoint_failures = Counter(
            "cadenza_checkpoint_failures",
            "checkpoint writes and claims that failed (Redis refused, timed out, an error)",
            registry=r,
        )
        self.node_resumes = Counter(
            "cadenza_node_resumes",
            "resume requests from clients whose stream's node was lost, by outcome (resumed; "
            "expired: no such stream; refused: already resumed, another key's, or no room)",
            labelnames=["outcome"],
            registry=r,
        )
        self.node_resume_gap = Histogram(
            "cadenza_node_resume_gap_seconds",
            "from the lost node's last checkpoint write to the first audio of the resume",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            registry=r,
        )
        self.streams_active = Gauge(
            "cadenza_streams_active", "streams currently producing audio", registry=r
        )
        self.stream_requests = Counter(
            "cadenza_stream_requests",
            "streams asked for, by transport (before validation and admission)",
            ["transport"],
            registry=r,
        )
        self.stream_refusals = Counter(
            "cadenza_stream_refusals",
            "streams refused before they started, by transport and error code",
            ["transport", "code"],
            registry=r,
        )
        self.streams_finished = Counter(
            "cadenza_streams_finished",
            "admitted streams ended, by reason (eos, length, cancelled, error) and transport",
            ["reason", "transport"],
            registry=r,
        )
        self.time_to_first_audio = Histogram(
            "cadenza_time_to_first_audio_seconds",
            "slot granted to the engine's first audio, by transport",
            ["transport"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.audio_seconds = Counter(
            "cadenza_audio_seconds",
            "seconds of audio the engine produced for admitted streams, by transport",
            ["transport"],
            registry=r,
        )
        self.engine_step = Histogram(
            "cadenza_engine_step_seconds",
            "engine step time",
            buckets=_STEP_BUCKETS_S,
            labelnames=["model"],
            registry=r,
        )
        self.engine_requests = Gauge(
            "cadenza_engine_requests",
            "requests held by the engine (running + waiting)",
            labelnames=["model"],
            registry=r,
        )
        self.engine_ready = Gauge(
            "cadenza_engine_ready",
            "1 while the engine is loaded and answering",
            labelnames=["model"],
            registry=r,
        )
        self.engine_crashes = Counter(
            "cadenza_engine_crashes",
            "engine processes lost (crashed, hung, or failed to start)",
            labelnames=["model"],
            registry=r,
        )
        self.engine_restarts = Counter(
            "cadenza_engine_restarts",
            "engine processes started again after a loss (or a rolling restart)",
            labelnames=["model"],
            registry=r,
        )
        self.engine_time_to_ready = Histogram(
            "cadenza_engine_time_to_ready_seconds",
            "from an engine's loss to its replacement answering",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            labelnames=["model"],
            registry=r,
        )
        self.engine_replicas = Gauge(
            "cadenza_engine_replicas",
            "engine replicas by state (starting, ready, draining, restarting, failed)",
            labelnames=["model", "state"],
            registry=r,
        )
        self.stream_resumes = Counter(
            "cadenza_stream_resumes",
            "streams whose engine was lost, by outcome (resumed elsewhere, or failed)",
            labelnames=["model", "outcome"],
            registry=r,
        )
        self.resume_gap = Histogram(
            "cadenza_stream_resume_gap_seconds",
            "from a stream's engine loss to its first audio from the engine that resumed it",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            labelnames=["model"],
            registry=r,
        )
        self.engine_running = Gauge(
            "cadenza_engine_running",
            "sequences in the engine's running batch",
            labelnames=["model"],
            registry=r,
        )
        self.engine_waiting = Gauge(
            "cadenza_engine_waiting",
            "sequences waiting for admission",
            labelnames=["model"],
            registry=r,
        )
        self.decode_occupancy = Gauge(
            "cadenza_engine_decode_occupancy",
            "running sequences / max_num_seqs, at the last stats report",
            labelnames=["model"],
            registry=r,
        )
        self.step_decodes = Histogram(
            "cadenza_engine_step_decode_tokens",
            "decode tokens per engine step (how many streams one forward pass served)",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
            labelnames=["model"],
            registry=r,
        )
        self.kv_pages_total = Gauge(
            "cadenza_kv_pages_total", "KV cache pages", labelnames=["model"], registry=r
        )
        self.kv_pages_free = Gauge(
            "cadenza_kv_pages_free",
            "KV cache pages free or cached",
            labelnames=["model"],
            registry=r,
        )
        self.preemptions = Counter(
            "cadenza_engine_preemptions",
            "sequences preempted (recomputed)",
            labelnames=["model"],
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "cadenza_prefix_hit_tokens",
            "prompt tokens served from the prefix cache",
            labelnames=["model"],
            registry=r,
        )
        self.edge_tasks = Gauge(
            "cadenza_edge_asyncio_tasks", "asyncio tasks alive in the edge process", registry=r
        )
        self.edge_loop_lag = Histogram(
            "cadenza_edge_loop_lag_seconds",
            "how late the edge's event loop woke a 50 ms timer (a stall holds every stream)",
            buckets=_STALL_BUCKETS_S,
            registry=r,
        )
        self.output_delay = Histogram(
            "cadenza_engine_output_delay_seconds",
            "time from an engine sending a stream's output to the edge reading it",
            buckets=_STALL_BUCKETS_S,
            labelnames=["model"],
            registry=r,
        )
        self.webrtc_peers = Gauge(
            "cadenza_webrtc_peers",
            "WebRTC peer connections, pending (offered, not connected yet) or connected",
            ["state"],
            registry=r,
        )
        self.admission_decisions = Counter(
            "cadenza_admission_decisions",
            "admission outcomes by priority, decision (admitted, queued, refused) and reason",
            labelnames=["model", "priority", "decision", "reason"],
            registry=r,
        )
        self.admission_holds = Counter(
            "cadenza_admission_holds",
            "streams that could not start at once, by what held them (realtime_budget, "
            "prefill_budget, arrival_wave, deadlines_slipping, max_streams, kv_memory, "
            "engine_unavailable, operator_cap, behind_others: streams already waiting)",
            labelnames=["model", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "cadenza_queue_depth",
            "requests waiting for capacity",
            labelnames=["model", "priority"],
            registry=r,
        )
        self.queue_oldest_age = Gauge(
            "cadenza_queue_oldest_age_seconds",
            "how long the oldest waiting request has waited",
            labelnames=["model", "priority"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "cadenza_queue_wait_seconds",
            "time admitted requests waited for capacity",
            labelnames=["model", "priority"],
            buckets=(*_LATENCY_BUCKETS_S, 30.0, 60.0, 120.0),
            registry=r,
        )
        self.streams_admitted = Gauge(
            "cadenza_streams_admitted",
            "streams holding an admission slot",
            labelnames=["model"],
            registry=r,
        )
        self.max_streams = Gauge(
            "cadenza_capacity_max_streams",
            "current estimate of concurrent real-time streams this server holds",
            labelnames=["model"],
            registry=r,
        )
        self.admission_open = Gauge(
            "cadenza_admission_open",
            "0 while admission is closed because chunks lost their slack",
            labelnames=["model"],
            registry=r,
        )
        self.realtime_factor = Gauge(
            "cadenza_admission_realtime_factor",
            "what admission multiplies predicted step times by: the 90th percentile of "
            "measured / predicted over recent engine reports",
            labelnames=["model"],
            registry=r,
        )
        self.claim_streams = Gauge(
            "cadenza_capacity_claim_streams",
            "nominal streams claimed at the realtime factor in use (basis=held), at what the "
            "windows alone say (evidence: where the claim is heading) and at the serving floor "
            "(calibrated: what it can climb back to)",
            labelnames=["model", "basis"],
            registry=r,
        )
        self.prefill_burst = Gauge(
            "cadenza_capacity_prefill_burst",
            "nominal streams that arriving together now would all have their prompts "
            "prefilled by their deadlines",
            labelnames=["model"],
            registry=r,
        )
        self.probes = Counter(
            "cadenza_admission_probes",
            "probes of idle engines asked for by admission, by how they ended (done, "
            "interrupted, timed_out, busy, unsupported; uncounted: too little decoding)",
            labelnames=["model", "outcome"],
            registry=r,
        )
        self.calibration_attempts = Gauge(
            "cadenza_calibration_attempts",
            "sweeps the replica's calibration took (more than one: earlier ones contradicted "
            "themselves; 0: read from the cache)",
            labelnames=["model", "replica"],
            registry=r,
        )
        self.calibration_consistent = Gauge(
            "cadenza_calibration_consistent",
            "1 when the replica's calibration agrees with itself; 0: it serves with a "
            "conservative one",
            labelnames=["model", "replica"],
            registry=r,
        )
        self.native_kernel_loaded = Gauge(
            "cadenza_native_kernel_loaded",
            "1 when the replica's engine loaded the native kernel library, built for level and "
            "using isa; 0: that work runs on torch paths (status says why: no_compiler, "
            "build_failed, load_failed, cpu_lacks, unknown_level)",
            labelnames=["model", "replica", "library", "level", "isa", "status"],
            registry=r,
        )
        self.deadline_slack = Histogram(
            "cadenza_chunk_deadline_slack_seconds",
            "time each audio chunk left the engine before its playout deadline (negative: late)",
            buckets=(-0.5, -0.2, -0.1, -0.05, 0.0, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0),
            labelnames=["model"],
            registry=r,
        )
        self.skipped_steps = Counter(
            "cadenza_engine_skipped_steps",
            "sequence-steps skipped by streams ahead of their playout clock",
            labelnames=["model"],
            registry=r,
        )
        self.step_correction = Gauge(
            "cadenza_engine_step_correction",
            "measured / calibrated step time (online correction of the capacity model)",
            labelnames=["model"],
            registry=r,
        )
