"""One served model's view of the edge's metrics: the engine and admission families of
:class:`~cadenza.edge.server.metrics.Metrics` with the ``model`` label bound, and the engine
replicas' ``stats`` summed into them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cadenza.contract.engine_stats import EngineStats
from cadenza.contract.messages import Stats
from cadenza.contract.native_kernels import NativeKernel
from cadenza.edge.server.metrics import Metrics


class _ForModel:
    """A labelled family seen by one model: ``labels(...)`` adds ``model``."""

    def __init__(self, family: Any, model: str) -> None:
        self.family = family
        self.model = model

    def labels(self, **labels: str) -> Any:
        return self.family.labels(model=self.model, **labels)


class ModelMetrics:
    """One served model's engine and admission metrics (the families of :class:`Metrics`
    with the ``model`` label bound)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.model = model
        self.engine_step = metrics.engine_step.labels(model=model)
        self.engine_requests = metrics.engine_requests.labels(model=model)
        self.engine_ready = metrics.engine_ready.labels(model=model)
        self.engine_crashes = metrics.engine_crashes.labels(model=model)
        self.engine_restarts = metrics.engine_restarts.labels(model=model)
        self.engine_time_to_ready = metrics.engine_time_to_ready.labels(model=model)
        self.engine_replicas = _ForModel(metrics.engine_replicas, model)
        self.stream_resumes = _ForModel(metrics.stream_resumes, model)
        self.resume_gap = metrics.resume_gap.labels(model=model)
        self.engine_running = metrics.engine_running.labels(model=model)
        self.engine_waiting = metrics.engine_waiting.labels(model=model)
        self.decode_occupancy = metrics.decode_occupancy.labels(model=model)
        self.step_decodes = metrics.step_decodes.labels(model=model)
        self.kv_pages_total = metrics.kv_pages_total.labels(model=model)
        self.kv_pages_free = metrics.kv_pages_free.labels(model=model)
        self.preemptions = metrics.preemptions.labels(model=model)
        self.prefix_hit_tokens = metrics.prefix_hit_tokens.labels(model=model)
        self.admission_decisions = _ForModel(metrics.admission_decisions, model)
        self.admission_holds = _ForModel(metrics.admission_holds, model)
        self.queue_depth = _ForModel(metrics.queue_depth, model)
        self.queue_oldest_age = _ForModel(metrics.queue_oldest_age, model)
        self.queue_wait = _ForModel(metrics.queue_wait, model)
        self.streams_admitted = metrics.streams_admitted.labels(model=model)
        self.max_streams = metrics.max_streams.labels(model=model)
        self.admission_open = metrics.admission_open.labels(model=model)
        self.realtime_factor = metrics.realtime_factor.labels(model=model)
        self.deadline_slack = metrics.deadline_slack.labels(model=model)
        self.claim_streams = _ForModel(metrics.claim_streams, model)
        self.prefill_burst = metrics.prefill_burst.labels(model=model)
        self.probes = _ForModel(metrics.probes, model)
        self.calibration_attempts = _ForModel(metrics.calibration_attempts, model)
        self.calibration_consistent = _ForModel(metrics.calibration_consistent, model)
        self._native_kernel_loaded = metrics.native_kernel_loaded
        self._native_kernel_series: dict[int, list[tuple[str, ...]]] = {}  # per replica
        self.skipped_steps = metrics.skipped_steps.labels(model=model)
        self.step_correction = metrics.step_correction.labels(model=model)
        self.output_delay = metrics.output_delay.labels(model=model)
        self._engine_totals: dict[tuple[int, str], int] = {}
        self._latest: dict[int, EngineStats] = {}  # per replica

    def observe_engine_stats(self, message: Stats, replica: int = 0) -> None:
        """Fold one engine ``stats`` message of ``replica`` into the metrics (gauges: the sum
        over the replicas' latest reports)."""
        for step in message.report.steps:
            self.engine_step.observe(step.seconds)
            self.step_decodes.observe(step.decodes)
        for slack_s in message.report.chunk_slack_s:
            self.deadline_slack.observe(slack_s)
        stats = message.stats
        self._latest[replica] = stats
        self._set_gauges()
        self.step_correction.set(stats.step_correction)
        for name, total, counter in (
            ("num_preemptions", stats.num_preemptions, self.preemptions),
            ("prefix_hit_tokens", stats.prefix_hit_tokens, self.prefix_hit_tokens),
            ("skipped_steps", stats.skipped_steps, self.skipped_steps),
        ):
            delta = total - self._engine_totals.get((replica, name), 0)
            if delta > 0:
                counter.inc(delta)
            self._engine_totals[(replica, name)] = total

    def set_native_kernels(self, replica: int, kernels: Sequence[NativeKernel]) -> None:
        """``replica``'s engine's native kernels, one series each (replacing the series an
        earlier engine of the replica reported)."""
        for labels in self._native_kernel_series.pop(replica, []):
            self._native_kernel_loaded.remove(*labels)
        series: list[tuple[str, ...]] = []
        for kernel in kernels:
            labels = (self.model, str(replica), kernel.library, kernel.level, kernel.isa)
            labels += (kernel.status,)
            self._native_kernel_loaded.labels(*labels).set(1 if kernel.loaded else 0)
            series.append(labels)
        self._native_kernel_series[replica] = series

    def forget_replica(self, replica: int) -> None:
        """``replica`` was lost: its counts start again from its replacement's."""
        self._latest.pop(replica, None)
        for key in [k for k in self._engine_totals if k[0] == replica]:
            del self._engine_totals[key]
        self._set_gauges()

    def _set_gauges(self) -> None:
        latest = list(self._latest.values())
        running = sum(s.num_running for s in latest)
        self.engine_running.set(running)
        self.engine_waiting.set(sum(s.num_waiting for s in latest))
        self.engine_requests.set(sum(s.num_requests for s in latest))
        self.decode_occupancy.set(running / max(sum(s.max_num_seqs for s in latest), 1))
        self.kv_pages_total.set(sum(s.kv_pages_total for s in latest))
        self.kv_pages_free.set(sum(s.kv_pages_free for s in latest))
