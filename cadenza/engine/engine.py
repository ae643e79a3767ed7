"""The engine: many streams, one copy of the weights, one forward pass per step.

Each :meth:`Engine.step` is the algorithm, in four calls::

    batch   = scheduler.schedule()              which sequences advance, by how many tokens
    result  = runner.run(batch)                 one forward pass, one sampled row each
    outcome = scheduler.postprocess(...)        rows appended, endings decided, pages freed
    outputs = audio.emit(outcome)               due chunks decoded in one batched codec call

and the step's cost goes to the telemetry (the deadline policy's online correction, the edge's
reports). With ``engine.overlap_steps`` (on CUDA by default) the runner's half is split: the
next step's forward and sampling are launched (:meth:`ModelRunner.launch`) right after
``postprocess`` and before ``audio.emit``, and read back (:meth:`ModelRunner.collect`) at the
start of the next :meth:`Engine.step`, so the device computes while the host decodes and
sends audio. Nothing is late: a step is scheduled only after the one before it was applied
(an ending stops the stream before its next step); a stream aborted while its step is in
flight has its pages freed at once (the device runs its queued work in order, so the stale
write lands before any later step's) and its result ignored; a request that arrives then
waits one step more. Requests come in through :class:`RequestIntake`; the parts, and the
announcement the edge reads (:mod:`cadenza.engine.identity`), are built by
:mod:`cadenza.engine.builder`.

What drives an engine from outside lives beside it as module functions over an ``Engine``, so
this module imports none of them: offline use (:func:`cadenza.engine.offline.synthesize`,
:func:`~cadenza.engine.offline.generate_ids`), the idle probes
(:func:`cadenza.engine.realtime.probe.probe_engine`) and the calibration
(:mod:`cadenza.engine.realtime.calibration`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from cadenza.config import CadenzaConfig
from cadenza.contract.calibration import Calibration
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import EngineStats, StepReport
from cadenza.contract.errors import RequestRejected
from cadenza.contract.precision import Precision
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.audio_stage import AudioStage, TokenOutputs, ending
from cadenza.engine.chunk_policy import CodecFrames
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.model_runner import LaunchedStep, ModelRunner
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.step_telemetry import StepTelemetry
from cadenza.engine.request_intake import RequestIntake
from cadenza.engine.scheduler import Scheduler
from cadenza.engine.sequence import Sequence
from cadenza.kernels.native import loader


class Engine:
    """Built by :meth:`from_pretrained` or :meth:`from_config` (see
    :mod:`cadenza.engine.builder` for what each part is)."""

    def __init__(
        self,
        model: AudioTokenModel,
        *,
        model_name: str,
        config: CadenzaConfig,
        frames: CodecFrames,
        kv_cache: PagedKVCache,
        kv: KVCacheManager,
        scheduler: Scheduler,
        intake: RequestIntake,
        audio: AudioStage | TokenOutputs,
        policy: DeadlinePolicy | None,
        telemetry: StepTelemetry,
        announced: EngineInfo,
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.config = config
        self.frames = frames
        self.layout = model.layout
        self.kv_cache = kv_cache
        self.kv = kv
        self.scheduler = scheduler
        self.runner = ModelRunner(
            model,
            kv_cache,
            max_num_seqs=scheduler.max_num_seqs,
            cuda_graphs=config.engine.cuda_graphs,
        )
        self.intake = intake
        self.audio = audio
        self.policy = policy
        self.telemetry = telemetry
        self.announced = announced
        self.realtime_plan: RealtimePlan = announced.realtime
        self.precision: Precision | None = announced.precision
        self.calibration: Calibration | None = None
        self._live: dict[str, Sequence] = {}
        self._outputs: list[StreamOutput] = []
        overlap = config.engine.overlap_steps
        self.overlaps_steps = model.device.type == "cuda" if overlap is None else overlap
        self._launched: LaunchedStep | None = None  # the next step, in flight
        self._last_step_end: float | None = None
        self._resting = False  # idle_s() said to wait since the last step
        intake.first_chunk_due_after_s = self.first_chunk_due_after_s

    @classmethod
    def from_pretrained(cls, name_or_path: str = "cadenza-tiny", **options: Any) -> Engine:
        """A model (built-in name or checkpoint directory) and its codec; ``options`` as
        :func:`cadenza.engine.builder.pretrained_config` takes them (``device``, ``dtype``,
        ``seed``, ``page_size``, ``max_num_seqs``, ``kv_cache_memory_bytes``, sections such
        as ``engine_config``, ``realtime``, ``cpu``, ...)."""
        from cadenza.engine.builder import build_engine, pretrained_config

        return build_engine(pretrained_config(name_or_path, **options))

    @classmethod
    def from_config(cls, config: CadenzaConfig) -> Engine:
        """The engine the configuration describes (model, device, dtypes, engine, limits)."""
        from cadenza.engine.builder import build_engine

        return build_engine(config)

    # -- identity ---------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        """What the edge needs to know about this engine (sent once, in ``ready``): the
        builder's announcement with the calibration and the native kernels as they are now."""
        return dataclasses.replace(
            self.announced, calibration=self.calibration, native_kernels=loader.report()
        )

    def first_chunk_due_after_s(self, prompt_rows: int) -> float:
        """How long after its arrival a stream with ``prompt_rows`` prompt rows has its first
        chunk due (:meth:`RealtimePlan.first_chunk_due_after_s`, at the calibration)."""
        step_model = None if self.policy is None else self.policy.step_model
        return self.realtime_plan.first_chunk_due_after_s(prompt_rows, step_model)

    @property
    def voices(self) -> tuple[str, ...]:
        return self.model.voices

    @property
    def sample_rate(self) -> int:
        return self._audio_stage().codec.sample_rate

    @property
    def frame_rate(self) -> float:
        return self._audio_stage().codec.frame_rate

    @property
    def codec_lookahead_frames(self) -> int:
        """Frames after a frame that its streamed audio waits for (in the first chunk too)."""
        return self._audio_stage().codec.lookahead_frames

    @property
    def identity_keys(self) -> tuple[str, ...]:
        """What makes this engine's KV and step times its own (model, dtype, KV dtype,
        weights dtype): prefix-cache keys, and part of the calibration's cache key."""
        return self.intake.extra_keys

    @property
    def num_requests(self) -> int:
        return len(self._live)

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request: SynthesisRequest) -> None:
        """Queue a stream. Raises :class:`RequestRejected` without changing any state."""
        self._check_room(request.request_id)
        seq = self.intake.speech(request)
        self._check_fits(seq)
        if seq.target_frames > 0:
            self.audio.open(seq)  # CodecError (a ValueError) when no decoder slot is free
        self._submit(seq)
        if seq.target_frames == 0:
            self._end(seq, FinishReason.LENGTH)

    def add_tokens(
        self,
        request_id: str,
        prompt: list[list[int]],
        max_new_steps: int,
        sampling: SamplingParams | None = None,
    ) -> Sequence:
        """Queue a raw token request (rows of ``K`` ids); returns its live state, whose
        ``output_rows`` grow as the engine steps. Its final output (no audio) comes from
        :meth:`step`."""
        self._check_room(request_id)
        seq = self.intake.tokens(request_id, prompt, max_new_steps, sampling or SamplingParams())
        self._check_fits(seq)
        self._submit(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a stream; its pages are free at once (no step uses them: an overlapped step
        still in flight writes there before any later step reads them) and its last output,
        ``CANCELLED``, comes from the next :meth:`step`."""
        seq = self._live.get(request_id)
        if seq is None:
            return False
        self._end(seq, FinishReason.CANCELLED)
        return True

    def sequence(self, request_id: str) -> Sequence | None:
        """A live request's state (``None`` once it has finished)."""
        return self._live.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._live) or bool(self._outputs) or self._launched is not None

    def idle_s(self) -> float:
        """How long every running stream can go without a step (0: step now): only when
        all of them are audio streams decoding more than ``realtime.max_lead_ms`` ahead of
        their listeners, nothing waits and no output is pending."""
        if self.policy is None or self.scheduler.waiting or self._outputs or self._launched:
            return 0.0
        idle = self.policy.idle_s(self.scheduler.running)
        self._resting = self._resting or idle > 0
        return idle

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[StreamOutput]:
        """Run one step; return the outputs that are ready (audio chunks, endings)."""
        started = time.perf_counter()
        # Time since the previous step, when the engine chose to rest in between (its
        # caches may be cold; telemetry says so, see StepRecord).
        rested_s = 0.0
        if self._resting and self._last_step_end is not None:
            rested_s = started - self._last_step_end
        self._resting = False
        launched = self._launched or self.runner.launch(self.scheduler.schedule())
        self._launched = None
        batch = launched.batch
        outcome = self.scheduler.postprocess(batch, self.runner.collect(launched))
        self.runner.retain(self.scheduler.running)
        if self.overlaps_steps and self._next_step_is_due():
            self._launched = self.runner.launch(self.scheduler.schedule())
        self._outputs += self.audio.emit(outcome)
        for seq in (*outcome.finished, *outcome.failed):
            del self._live[seq.request_id]
        self._last_step_end = time.perf_counter()
        self.telemetry.record_step(batch, self._last_step_end - started, rested_s)
        outputs, self._outputs = self._outputs, []
        return outputs

    def _next_step_is_due(self) -> bool:
        """Whether to launch the next step now (overlapped): there is work, and the engine
        would not rest first (every running stream far ahead of its listener, nothing
        waiting: see :meth:`idle_s`)."""
        if not self.scheduler.running and not self.scheduler.waiting:
            return False
        if self.policy is None or self.scheduler.waiting:
            return True
        return self.policy.idle_s(self.scheduler.running) <= 0

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            max_num_seqs=self.scheduler.max_num_seqs,
            kv_pages_total=self.kv.pool.num_pages,
            kv_pages_free=self.kv.pool.num_free_pages,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_hit_tokens=self.kv.prefix_hit_tokens,
            prefix_query_tokens=self.kv.prefix_query_tokens,
            skipped_steps=self.scheduler.num_skipped,
            step_correction=1.0 if self.policy is None else self.policy.correction.factor,
            spare_lead_s=(
                None if self.policy is None else self.policy.spare_lead_s(self.scheduler.running)
            ),
        )

    def take_report(self) -> StepReport:
        return self.telemetry.take_report()

    def apply_calibration(self, calibration: Calibration | None) -> None:
        """Let the deadline policy (and, through :attr:`info`, admission) use a measured
        step-time model."""
        if calibration is not None and self.policy is None:
            raise TypeError(f"{self.model_name} has no playout deadlines to calibrate")
        self.calibration = calibration
        if self.policy is not None:
            self.policy.step_model = None if calibration is None else calibration.model

    def check_integrity(self) -> None:
        """Assert that pages, reservations and sequences agree (tests call it after every
        scenario). Raises ``AssertionError``."""
        self.scheduler.check_integrity()
        self.runner.check_integrity(self.scheduler.running)
        scheduled = {s.request_id for s in (*self.scheduler.running, *self.scheduler.waiting)}
        assert scheduled == set(self._live), "engine and scheduler disagree on live sequences"

    # -- internals --------------------------------------------------------------------------

    def _check_room(self, request_id: str) -> None:
        if request_id in self._live:
            raise RequestRejected(f"duplicate request id {request_id!r}")
        if len(self._live) >= self.config.engine.max_pending_requests:
            raise RequestRejected("engine queue is full")

    def _check_fits(self, seq: Sequence) -> None:
        needed = self.kv.reservation(seq)
        if needed > self.kv.pool.num_pages:
            raise RequestRejected(
                f"request needs {needed} KV pages; the cache has {self.kv.pool.num_pages}"
            )

    def _submit(self, seq: Sequence) -> None:
        self._live[seq.request_id] = seq
        self.scheduler.add(seq)

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        """End a stream outside a step (cancelled, or nothing to say)."""
        self.scheduler.finish(seq, reason)
        self.runner.retain(self.scheduler.running)
        self.audio.release(seq)
        del self._live[seq.request_id]
        self._outputs.append(ending(seq, reason))

    def _audio_stage(self) -> AudioStage:
        if not isinstance(self.audio, AudioStage):
            raise TypeError(f"{self.model_name} produces no audio")
        return self.audio
