"""Bark served: the engine process's :class:`~cadenza.engine.serving_engine.ServingEngine` for a
Bark checkpoint. Every stream runs through one :class:`BarkBatch`, so the three stages are
batched across all of the checkpoint's streams; each fine window's final frames come back as
an audio chunk as soon as EnCodec has decoded them. Streams far enough ahead of their
listeners skip steps (:mod:`~cadenza.engine.models.bark.bark_playout`).

What it announces (:attr:`BarkEngine.info`) is in Bark's own units, read by the edge's
admission like any engine's:

- **memory**: a stream holds one semantic and one coarse KV slot of the stage's block size
  (Bark's context never grows past it), never both at once but both counted, so a "page" here
  is one stream's slot pair and ``kv_pages_total`` the streams the engine holds
  (``engine.max_num_seqs``); the fine stage keeps no KV;
- **time**: a "step" is one codec frame of every running stream's audio, all three stages and
  EnCodec included, as :mod:`~cadenza.engine.models.bark.bark_calibration` measures it at
  start-up (per stage as well); the TTFA target is the first audio measured there, since Bark
  speaks only after a whole fine window (for a short utterance: after all of its coarse codes).
  Live steps are reported in the same unit: each :meth:`BarkBatch.step`'s time over what its
  own work cost at calibration (:class:`~cadenza.engine.models.bark.bark_step_cost.
  BarkStepCost`), times a frame of that many streams, so the edge's realtime factor weighs
  Bark's live steps (and its idle probes, :meth:`BarkEngine.probe`) as it does any engine's.

A stream moved here from a lost engine (``resume``: the frames its listener has had, no rows)
is generated again from its start and those frames' audio dropped: identical for greedy and
seeded streams, and one without a seed draws it from its request id (:func:`request_seed`).

Sampling is by temperature only: ``temperature`` for the semantic and coarse stages (0:
greedy), ``fine_temperature`` for the fine stage (unset: Bark's 0.5 when the others sample,
greedy when they are greedy; 0: greedy); any other sampling field set away from the announced
defaults is refused rather than ignored.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cadenza.config import CadenzaConfig
from cadenza.contract.calibration import Calibration
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import (
    EngineStats,
    ProbeOutcome,
    ProbeResult,
    StepRecord,
    StepReport,
)
from cadenza.contract.errors import RequestRejected
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams, UnsupportedSamplingField, check_model_fields
from cadenza.engine.device import resolve_device, resolve_dtype
from cadenza.engine.models.bark.bark_batch import BarkBatch
from cadenza.engine.models.bark.bark_checkpoint import BarkCheckpoint, load_bark
from cadenza.engine.models.bark.bark_offline import DEFAULT_VOICE
from cadenza.engine.models.bark.bark_playout import BarkPlayout
from cadenza.engine.models.bark.bark_request import BarkRequest, BarkRequestError, BarkSampling
from cadenza.engine.models.bark.bark_step_cost import BarkStepCost, StepWork
from cadenza.kernels.native import loader

log = logging.getLogger(__name__)

FINE_TEMPERATURE = 0.5
"""Bark's fine-stage temperature when a request samples (``BarkModel.generate``'s default)."""

DEFAULT_SAMPLING = SamplingParams(temperature=0.7, top_k=0)
SAMPLING_FIELDS = frozenset({"fine_temperature"})  # the model-specific fields Bark takes
"""What a request gets unless it says otherwise: the ``bark`` package's temperature of 0.7 for
the semantic and coarse stages, no other filter."""

PROBE_TEXT = "A probe of the machine's speed, spoken to nobody."

PROBE_SHARE = 0.8
"""The share of a probe's time limit it steps for before it stops as ``done``."""

ONE_PAGE_PER_STREAM = 2**30
"""The announced page size: more tokens than any Bark stream has, so every stream costs one
page (its slot pair)."""


@dataclass
class _Live:
    request_id: str
    stream_id: int
    semantic_cap: int
    skip_frames: int = 0  # a resumed stream's frames its listener already has


class BarkEngine:
    """A Bark checkpoint's streams in one batch (see the module's docstring)."""

    def __init__(
        self,
        bark: BarkCheckpoint,
        *,
        config: CadenzaConfig,
        model_name: str,
        device: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bark = bark
        self.config = config
        self.model_name = model_name
        self.device = device
        self.max_streams = config.engine.max_num_seqs
        self.batch = BarkBatch(
            bark, prefill_chunk=config.engine.max_num_batched_tokens, max_streams=self.max_streams
        )
        self.calibration: Calibration | None = None
        self.step_cost: BarkStepCost | None = None
        self.last_step: tuple[StepWork, float] = (StepWork(), 0.0)
        """The latest step's work and wall seconds."""
        self._records: list[StepRecord] = []
        self.ttfa_s = config.realtime.ttfa_target_ms / 1000.0
        self.voices = (DEFAULT_VOICE, *sorted(bark.voices))
        self._live: dict[str, _Live] = {}
        self._by_stream: dict[int, _Live] = {}
        self._ended: list[StreamOutput] = []
        self.playout = BarkPlayout(config.realtime.playout_reserve_ms / 1000.0, clock)
        self.rests = True
        """Whether streams ahead of their listeners skip steps (off while measuring)."""

    @classmethod
    def from_config(cls, config: CadenzaConfig, directory: Path) -> BarkEngine:
        """The checkpoint in ``directory`` on the configured device, in the configured dtype
        (float32 on a CPU), not yet calibrated
        (:func:`~cadenza.engine.models.bark.bark_calibration.calibrate_bark`)."""
        if config.model.torch_threads:
            torch.set_num_threads(config.model.torch_threads)
        device = resolve_device(config.model.device)
        bark = load_bark(directory, device, resolve_dtype(config.model.dtype, device))
        return cls(bark, config=config, model_name=config.model.public_name, device=device.type)

    def apply_calibration(self, calibration: Calibration, step_cost: BarkStepCost) -> None:
        """Serve with this measured per-frame model (live steps weighed by ``step_cost``); its
        first audio is the TTFA target."""
        self.calibration = calibration
        self.step_cost = step_cost
        measured = calibration.first_audio_s
        self.ttfa_s = max(self.config.realtime.ttfa_target_ms / 1000.0, measured)
        last = calibration.samples[-1]
        log.info(
            "%s: a frame of %d streams takes %.1f ms (a frame period is %.1f ms); the first "
            "audio of its longest utterance comes after %.1f s alone",
            self.model_name,
            last.tokens,
            last.ms,
            1000.0 / self.frame_rate,
            measured,
        )

    # -- identity ---------------------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return int(self.bark.codec.sample_rate)

    @property
    def frame_rate(self) -> float:
        return float(self.bark.codec.frame_rate)

    @property
    def hop_length(self) -> int:
        """Samples a codec frame decodes to."""
        return round(self.sample_rate / self.frame_rate)

    @property
    def info(self) -> EngineInfo:
        realtime = self.config.realtime
        frame_period_s = 1.0 / self.frame_rate
        constants = self.bark.constants
        window = constants.max_fine_input_length - constants.max_fine_history_length
        plan = RealtimePlan(
            step_period_s=frame_period_s,
            headroom=realtime.headroom,
            ttfa_target_s=self.ttfa_s,
            playout_reserve_s=realtime.playout_reserve_ms / 1000.0,
            first_chunk_frames=window,
            first_chunk_steps=0,
            chunk_frames=window,
            lookahead_frames=0,
            max_lead_s=realtime.max_lead_ms / 1000.0,
            nominal_prompt_rows=0,
        )
        return EngineInfo(
            model_name=self.model_name,
            voices=self.voices,
            sample_rate=self.sample_rate,
            frame_rate=self.frame_rate,
            device=self.device,
            shape=StreamShape(ONE_PAGE_PER_STREAM, 1, 0, 0),
            kv_pages_total=self.max_streams,
            max_num_seqs=self.max_streams,
            realtime=plan,
            calibration=self.calibration,
            default_sampling=DEFAULT_SAMPLING,
            native_kernels=loader.report(),
            sampling_fields=tuple(sorted(SAMPLING_FIELDS)),
            segments_text=True,
        )

    # -- requests -----------------------------------------------------------------------------

    def bark_request(self, request: SynthesisRequest) -> tuple[BarkRequest, int]:
        """What ``request`` asks of the batch, and its cap on semantic tokens. Raises
        :class:`RequestRejected` for what Bark cannot do (speech prompts, context, resuming,
        sampling filters other than temperature, an unknown voice)."""
        if request.voice not in self.voices:
            raise RequestRejected(
                f"unknown voice {request.voice!r}; voices: {', '.join(self.voices)}"
            )
        if request.prompt_audio:
            raise RequestRejected("Bark takes no speech prompt (its voices are presets)")
        if request.context:
            raise RequestRejected("Bark takes no conversation context")
        if request.resume is not None and request.resume.rows:
            raise RequestRejected("a Bark stream resumes from its frames heard, not from rows")
        sampling = request.sampling
        try:
            check_model_fields(sampling, SAMPLING_FIELDS, self.model_name)
        except UnsupportedSamplingField as exc:
            raise RequestRejected(str(exc)) from exc
        for name in ("top_k", "top_p", "min_p", "repetition_penalty", "stop_ids"):
            if getattr(sampling, name) != getattr(DEFAULT_SAMPLING, name):
                raise RequestRejected(f"Bark samples by temperature only; {name} is not supported")
        constants = self.bark.constants
        cap = constants.max_new_semantic_tokens
        if request.max_duration_s is not None:
            if not (math.isfinite(request.max_duration_s) and request.max_duration_s > 0):
                raise RequestRejected("max_duration_s must be positive")
            cap = min(cap, math.ceil(request.max_duration_s * constants.semantic_rate_hz))
        temperature = None if sampling.greedy else sampling.temperature
        fine = FINE_TEMPERATURE if sampling.fine_temperature is None else sampling.fine_temperature
        if sampling.greedy and sampling.fine_temperature is None:
            fine = 0.0
        seed = sampling.seed if sampling.seed is not None else request_seed(request.request_id)
        stages = BarkSampling(
            semantic_temperature=temperature,
            coarse_temperature=temperature,
            fine_temperature=fine or None,
            max_semantic_tokens=cap,
            seed=seed % 2**63,
        )
        voice = None if request.voice == DEFAULT_VOICE else request.voice
        return BarkRequest(request.text, voice, stages), cap

    def add_request(self, request: SynthesisRequest) -> None:
        if request.request_id in self._live:
            raise RequestRejected(f"duplicate request id {request.request_id!r}")
        bark_request, cap = self.bark_request(request)
        try:
            stream_id = self.batch.add(bark_request)
        except BarkRequestError as exc:
            raise RequestRejected(str(exc)) from exc
        skip = 0 if request.resume is None else max(request.resume.frames_sent, 0)
        live = _Live(request.request_id, stream_id, cap, skip)
        self._live[request.request_id] = live
        self._by_stream[stream_id] = live

    def abort_request(self, request_id: str) -> bool:
        live = self._live.pop(request_id, None)
        if live is None:
            return False
        del self._by_stream[live.stream_id]
        self.batch.cancel(live.stream_id)
        self.playout.forget(live.stream_id)
        self._ended.append(StreamOutput(request_id, _EMPTY, FinishReason.CANCELLED))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._live) or bool(self._ended)

    def _resting(self) -> dict[int, float]:
        """The streams far enough ahead of their listeners to skip the next step
        (:class:`~cadenza.engine.models.bark.bark_playout.BarkPlayout`), each with how long
        it could still rest."""
        if not self.rests:
            return {}
        streams = (live.stream_id for live in self._live.values())
        return self.playout.resting(streams, self.batch.steps_to_audio)

    def idle_s(self) -> float:
        """How long the engine may wait: while every stream is far enough ahead of its
        listener, until the first of them must go on (0: step now)."""
        if self._ended or not self._live:
            return 0.0
        resting = self._resting()
        return min(resting.values()) if len(resting) == len(self._live) else 0.0

    def step(self) -> list[StreamOutput]:
        """One :meth:`BarkBatch.step` for every stream not far enough ahead of its listener to
        rest; the audio made."""
        outputs, self._ended = self._ended, []
        resting = self._resting()
        advancing = len(self._live) - len(resting)
        if advancing <= 0:
            return outputs
        started = time.perf_counter()
        chunks = self.batch.step(frozenset(resting))
        self.last_step = (self.batch.last_work, time.perf_counter() - started)
        self.playout.observe_step(self.last_step[1], advancing)
        self._record(advancing)
        for chunk in chunks:
            live = self._by_stream.get(chunk.stream_id)
            if live is None:
                continue
            audio = chunk.audio.float().clamp(-1.0, 1.0).cpu().numpy()
            codes = None if chunk.codes is None else chunk.codes.numpy().astype(np.uint16)
            if live.skip_frames and codes is not None:
                dropped = min(live.skip_frames, len(codes))
                live.skip_frames -= dropped
                codes = codes[dropped:]
                audio = audio[dropped * self.hop_length :]
            self.playout.delivered(live.stream_id, audio.size / self.sample_rate)
            reason = None
            if chunk.result is not None:
                capped = len(chunk.result.semantic) >= live.semantic_cap
                reason = FinishReason.LENGTH if capped else FinishReason.EOS
                del self._live[live.request_id], self._by_stream[live.stream_id]
                self.playout.forget(live.stream_id)
            if audio.size or reason is not None:
                outputs.append(StreamOutput(live.request_id, audio, reason, codes=codes))
        return outputs

    def probe(self, batch: int, max_ms: float, interrupted: Callable[[], bool]) -> ProbeResult:
        """Step ``batch`` synthetic streams (greedy, at most ``engine.max_num_seqs``) for
        :data:`PROBE_SHARE` of ``max_ms``, or until something arrives for the engine
        (``interrupted``) or they end; then cancel them. Their steps, reported as live ones
        are (each weighed by what its own work cost at calibration, so the semantic steps a
        short probe runs count for what they are), are the result. ``unsupported`` without a
        calibration, ``busy`` while a stream runs; the engine is idle again after."""
        if self.step_cost is None:
            return ProbeResult(StepReport(), 0, "unsupported")
        if self.has_unfinished_requests():
            return ProbeResult(StepReport(), 0, "busy")
        batch = min(max(batch, 1), self.max_streams)
        voice = self.voices[-1]
        greedy = DEFAULT_SAMPLING.with_overrides(temperature=0.0)
        ids = [f"probe-{index}" for index in range(batch)]
        deadline = time.perf_counter() + PROBE_SHARE * max_ms / 1000.0
        outcome: ProbeOutcome = "done"
        self.rests = False  # every step measures all of the probe's streams
        try:
            for request_id in ids:
                self.add_request(SynthesisRequest(request_id, PROBE_TEXT, voice, None, greedy))
            while self._live and time.perf_counter() < deadline:
                if interrupted():
                    outcome = "interrupted"
                    break
                self.step()
        finally:
            for request_id in ids:
                self.abort_request(request_id)
            self.step()  # delivers (and drops) the cancellations
            self.rests = True
        return ProbeResult(self.take_report(), batch, outcome)

    def _record(self, streams: int) -> None:
        """The latest step as the frame of ``streams`` streams it is a share of: its time over
        what its work cost at calibration, times that frame's calibrated time."""
        if self.step_cost is None or self.calibration is None:
            return
        work, seconds = self.last_step
        predicted_ms = self.step_cost.predict_ms(work)
        if predicted_ms <= 0:
            return
        frame_ms = self.calibration.model.predict_ms(streams, 0)
        self._records.append(StepRecord(seconds * frame_ms / predicted_ms, streams, streams, 0))

    def stats(self) -> EngineStats:
        running = self.batch.active
        return EngineStats(
            num_running=running,
            num_waiting=0,
            max_num_seqs=self.max_streams,
            kv_pages_total=self.max_streams,
            kv_pages_free=self.max_streams - running,
            num_preemptions=0,
            prefix_hit_tokens=0,
            prefix_query_tokens=0,
            skipped_steps=0,
            step_correction=1.0,
        )

    def take_report(self) -> StepReport:
        """Every step since the last call, each as the frame of audio it is a share of
        (:meth:`_record`; none without a calibration). EnCodec's time is inside each step, as
        in the calibration, so no codec time apart."""
        records, self._records = self._records, []
        return StepReport(steps=tuple(records))

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` when a KV or codec slot is held by no live stream."""
        held = self.batch.semantic_kv.slots_in_use + self.batch.coarse_kv.slots_in_use
        assert held <= self.batch.active, (held, self.batch.active)
        assert self.batch.codec_slots_in_use <= self.batch.active
        assert self.batch.active == len(self._live), (self.batch.active, len(self._live))


_EMPTY = np.zeros(0, dtype=np.float32)


def request_seed(request_id: str) -> int:
    """The seed of a request that gave none: drawn from its id, so that the same request
    resumed on another engine (its id kept) draws the same tokens and its audio goes on
    where its listener left it; a fresh seed for every new request."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") % 2**63
