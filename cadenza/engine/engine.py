"""The engine: many streams, one copy of the weights, one forward pass per step.

Each :meth:`Engine.step`:

1. the scheduler picks the step's work (decode tokens first, then prefill chunks) under the
   token budget, admitting waiting sequences whose KV pages fit;
2. the model runner runs one forward pass over the flattened batch; if it raises, each
   sequence is retried alone so a bad request fails by itself;
3. every sequence whose last token was computed samples one row; its layout decides whether it
   is finished;
4. newly full KV blocks are hashed for prefix caching; finished sequences release their pages;
5. every stream with enough new codec frames (or that just finished) is decoded to audio in
   one batched call of the streaming decoder.

Every audio stream carries a :class:`PlayoutClock`; the scheduler's :class:`DeadlinePolicy`
orders and sizes work by it. Each step is timed: a calibrated :class:`StepTimeModel` (see
:mod:`cadenza.engine.calibration`) is corrected online from those times, and every chunk's
slack against its deadline is recorded for the edge's metrics and admission.

Offline APIs: :meth:`generate_ids` (token LMs, used to check exactness against transformers)
and :meth:`synthesize` (text to audio).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cadenza.codecs.encodec import CodecError, EncodecCodec, load_codec
from cadenza.codecs.streaming_decoder import StreamingDecoder
from cadenza.config import CadenzaConfig, EngineConfig, LimitsConfig
from cadenza.engine.block_pool import BlockPool
from cadenza.engine.deadline_policy import DeadlinePolicy
from cadenza.engine.kv_cache_manager import KVCacheManager
from cadenza.engine.memory import available_memory_bytes
from cadenza.engine.messages import EngineInfo
from cadenza.engine.model_runner import ForwardResult, ModelRunner
from cadenza.engine.models.llama import fuse_llama_projections
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.registry import load_model
from cadenza.engine.paged_kv_cache import PagedKVCache
from cadenza.engine.playout_clock import PlayoutClock
from cadenza.engine.request import FinishReason, StreamOutput, SynthesisRequest, request_duration_s
from cadenza.engine.sampler import sample_rows
from cadenza.engine.sampling_params import SamplingParams
from cadenza.engine.scheduler import ScheduledBatch, Scheduler
from cadenza.engine.sequence import Sequence, SequenceStatus
from cadenza.engine.step_time_model import StepTimeModel, attended_context
from cadenza.kernels.cpu_linear import pack_linears, packing_available
from cadenza.kernels.int8_linear import quantize_linears

log = logging.getLogger(__name__)

_EMPTY_AUDIO = np.zeros(0, dtype=np.float32)


class RequestRejected(ValueError):
    """The engine will not take this request (unknown voice, duplicate id, too large, full)."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for metrics and admission."""

    num_running: int
    num_waiting: int
    max_num_seqs: int
    kv_blocks_total: int
    kv_blocks_free: int
    num_preemptions: int
    prefix_hit_tokens: int
    prefix_query_tokens: int
    last_batch_decodes: int
    last_batch_tokens: int
    last_batch_context: int  # KV positions the last step's sequences attend to
    skipped_steps: int  # sequence-steps skipped by streams ahead of their playout
    step_correction: float  # measured / calibrated step time (1.0 when uncalibrated)


class Engine:
    def __init__(
        self,
        model: AudioTokenModel,
        codec: EncodecCodec | None,
        *,
        model_name: str,
        engine_config: EngineConfig | None = None,
        limits: LimitsConfig | None = None,
        weights_dtype: str = "auto",
    ) -> None:
        self.model = model
        self.codec = codec
        self.model_name = model_name
        self.config = config = engine_config or EngineConfig()
        self.limits = limits or LimitsConfig()
        self.layout = model.layout
        device, dtype = model.device, model.dtype
        fuse_llama_projections(model)
        self.weights_dtype = weights_dtype
        if weights_dtype == "int8":
            quantize_linears(model)  # on the CPU these come prepacked (dequantized on load)
        elif config.pack_cpu_weights and packing_available(device, dtype):
            pack_linears(model)
        if self.layout.produces_audio and (
            codec is None or codec.num_codebooks != self.layout.codebooks_per_frame
        ):
            raise ValueError(
                f"{model_name} needs a codec with {self.layout.codebooks_per_frame} codebooks"
            )
        budget = config.kv_cache_memory_bytes or int(
            available_memory_bytes(device) * config.kv_cache_memory_fraction
        )
        self.kv_dtype = resolve_kv_dtype(config.kv_dtype, dtype)
        self.kv_cache = PagedKVCache.from_budget(
            model.kv_spec, budget, config.block_size, self.kv_dtype, device
        )
        self.block_pool = BlockPool(self.kv_cache.num_blocks, config.enable_prefix_caching)
        self.kv_manager = KVCacheManager(
            self.block_pool, config.block_size, config.reserve_max_output
        )
        self.steps_per_frame = self.layout.steps_for_frames(101) - self.layout.steps_for_frames(100)
        self.policy: DeadlinePolicy | None = None
        if self.layout.produces_audio:
            assert codec is not None
            self.policy = DeadlinePolicy(
                self.layout,
                frame_period_s=1.0 / codec.frame_rate,
                steps_per_frame=self.steps_per_frame,
                first_chunk_frames=config.first_chunk_frames,
                chunk_frames=config.chunk_frames,
                headroom=config.realtime_headroom,
                min_prefill_tokens=config.block_size,
                clock=time.monotonic,
            )
        self.scheduler = Scheduler(
            self.kv_manager, config.max_num_batched_tokens, config.max_num_seqs, self.policy
        )
        self.runner = ModelRunner(model, self.kv_cache, device)
        self.decoder: StreamingDecoder | None = None
        self._free_codec_slots: list[int] = []
        if self.layout.produces_audio:
            assert codec is not None
            self.decoder = StreamingDecoder(codec, config.max_pending_requests)
            self._free_codec_slots = list(range(config.max_pending_requests - 1, -1, -1))
        masks = self.layout.sampling_masks()
        self._masks = None if masks is None else masks.to(device)
        self._extra_keys = (model_name, str(dtype), f"kv={self.kv_dtype}", f"w={weights_dtype}")
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[StreamOutput] = []
        self._last_batch = ScheduledBatch()
        self._last_context = 0
        self.last_step_s = 0.0
        # Slack of each delivered chunk (seconds), drained by whoever reports metrics.
        self.chunk_slacks_s: deque[float] = deque(maxlen=4096)
        self.codec_seconds = 0.0  # time in the streaming decoder, and the frames it decoded
        self.codec_frames = 0

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "cadenza-tiny",
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        block_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        enable_prefix_caching: bool | None = None,
        kv_cache_memory_bytes: int | None = None,
        engine_config: EngineConfig | None = None,
        limits: LimitsConfig | None = None,
        weights_dtype: str = "auto",
    ) -> Engine:
        """Build a model (built-in name or checkpoint directory) and its codec on ``device``.
        ``weights_dtype="int8"`` makes every linear layer weight-only int8 (W8A16).

        Keyword arguments given here override the same fields of ``engine_config``.
        """
        overrides = {
            key: value
            for key, value in {
                "block_size": block_size,
                "max_num_batched_tokens": max_num_batched_tokens,
                "max_num_seqs": max_num_seqs,
                "enable_prefix_caching": enable_prefix_caching,
                "kv_cache_memory_bytes": kv_cache_memory_bytes,
            }.items()
            if value is not None
        }
        config = (engine_config or EngineConfig()).model_copy(update=overrides)
        torch_device = resolve_device(device)
        model = load_model(
            name_or_path, seed=seed, device=torch_device, dtype=resolve_dtype(dtype, torch_device)
        )
        codec = None
        if model.layout.produces_audio and model.codec_name is not None:
            codec = load_codec(model.codec_name, device=torch_device, seed=seed)
        return cls(
            model,
            codec,
            model_name=name_or_path,
            engine_config=config,
            limits=limits,
            weights_dtype=weights_dtype,
        )

    @classmethod
    def from_config(cls, config: CadenzaConfig) -> Engine:
        """The engine the configuration describes (model, device, dtype, engine, limits)."""
        if config.model.torch_threads:
            torch.set_num_threads(config.model.torch_threads)
        return cls.from_pretrained(
            config.model.name,
            device=config.model.device,
            dtype=config.model.dtype,
            seed=config.model.seed,
            engine_config=config.engine,
            limits=config.limits,
            weights_dtype=config.model.weights_dtype,
        )

    # -- identity ---------------------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return self._codec().sample_rate

    @property
    def frame_rate(self) -> float:
        return self._codec().frame_rate

    @property
    def voices(self) -> tuple[str, ...]:
        return self.model.voices

    @property
    def num_requests(self) -> int:
        return len(self._seqs)

    # -- request lifecycle ------------------------------------------------------------------

    def add_request(self, request: SynthesisRequest) -> None:
        """Queue a stream. Raises :class:`RequestRejected` without changing any state."""
        if not self.layout.produces_audio:
            raise RequestRejected(f"{self.model_name} is a text model; it cannot synthesize")
        if request.voice not in self.voices:
            raise RequestRejected(f"unknown voice {request.voice!r}; voices: {self.voices}")
        duration_s = request_duration_s(request.text, request.max_duration_s, self.limits)
        target_frames = max(0, round(duration_s * self.frame_rate))
        seq = self._new_sequence(
            request.request_id,
            self.model.build_prompt(request.text, request.voice, self._prompt_codes(request)),
            request.sampling,
            max_new_steps=self.layout.steps_for_frames(target_frames),
            conditioning=f"voice={request.voice}",
        )
        seq.target_frames = target_frames
        seq.playout = PlayoutClock(
            arrival_s=time.monotonic(),
            ttfa_target_s=self.config.ttfa_target_ms / 1000.0,
            frame_period_s=1.0 / self.frame_rate,
            reserve_s=self.config.playout_reserve_ms / 1000.0,
        )
        self._submit(seq)
        seq.codec_slot = self._free_codec_slots.pop()
        self._streaming_decoder().open(seq.codec_slot)
        if target_frames == 0:
            self._finish(seq, FinishReason.LENGTH, _EMPTY_AUDIO)

    def _prompt_codes(self, request: SynthesisRequest) -> list[list[int]] | None:
        """The speech prompt as codec frames; refused if too long or not audio."""
        if not request.prompt_audio:
            return None
        if len(request.prompt_audio) % 4:
            raise RequestRejected("prompt_audio must be float32 samples")
        audio = np.frombuffer(request.prompt_audio, dtype="<f4")
        seconds = audio.size / request.prompt_sample_rate
        if seconds > self.limits.max_prompt_audio_s:
            raise RequestRejected(
                f"speech prompt is {seconds:.1f} s; the limit is {self.limits.max_prompt_audio_s} s"
            )
        try:
            codes = self._codec().encode_pcm(audio.copy(), request.prompt_sample_rate)
        except CodecError as exc:
            raise RequestRejected(f"speech prompt: {exc}") from exc
        return [list(map(int, frame)) for frame in codes.T.tolist()]

    def abort_request(self, request_id: str) -> bool:
        """Stop a stream; its pages are free at once (steps are synchronous, so none is using
        them) and its last output, ``CANCELLED``, comes from the next :meth:`step`."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        self._finish(seq, FinishReason.CANCELLED, _EMPTY_AUDIO)
        return True

    def engine_info(self, calibration: dict[str, Any] | None = None) -> EngineInfo:
        """What the edge needs to know about this engine (sent once, in ``ready``)."""
        return EngineInfo(
            model_name=self.model_name,
            voices=self.voices,
            sample_rate=self.sample_rate,
            frame_rate=self.frame_rate,
            device=str(self.model.device),
            steps_per_frame=self.steps_per_frame,
            block_size=self.config.block_size,
            kv_blocks_total=self.block_pool.num_blocks,
            max_num_seqs=self.config.max_num_seqs,
            calibration=calibration,
        )

    def sequence(self, request_id: str) -> Sequence | None:
        """A live request's state (``None`` once it has finished)."""
        return self._seqs.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs) or bool(self._pending)

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[StreamOutput]:
        """Run one step; return the outputs that are ready (audio chunks, finished streams)."""
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        self._last_batch = batch
        self._last_context = attended_context(
            [seq.num_tokens for seq in batch.decodes], [seq.num_tokens for seq, _ in batch.prefills]
        )
        if not batch.is_empty:
            result = self._forward(batch)
            self._advance(batch, result)
        self.last_step_s = time.perf_counter() - started
        policy = self.policy
        if not batch.is_empty and policy is not None and policy.step_model is not None:
            policy.correction.observe(
                policy.step_model,
                batch.num_tokens,
                len(batch.decodes),
                self._last_context,
                1000.0 * self.last_step_s,
            )
        outputs, self._pending = self._pending, []
        return outputs

    @property
    def step_model(self) -> StepTimeModel | None:
        """The calibrated step-time model the deadline policy uses (``None``: uncalibrated)."""
        return None if self.policy is None else self.policy.step_model

    @step_model.setter
    def step_model(self, model: StepTimeModel | None) -> None:
        if self.policy is None:
            raise TypeError(f"{self.model_name} has no playout deadlines to calibrate")
        self.policy.step_model = model

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            max_num_seqs=self.scheduler.max_num_seqs,
            kv_blocks_total=self.block_pool.num_blocks,
            kv_blocks_free=self.block_pool.num_free_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_hit_tokens=self.kv_manager.prefix_hit_tokens,
            prefix_query_tokens=self.kv_manager.prefix_query_tokens,
            last_batch_decodes=len(self._last_batch.decodes),
            last_batch_tokens=self._last_batch.num_tokens,
            last_batch_context=self._last_context,
            skipped_steps=self.scheduler.num_skipped,
            step_correction=1.0 if self.policy is None else self.policy.correction.factor,
        )

    def check_integrity(self) -> None:
        """Assert that pages, reservations and sequences agree (tests call it after every
        scenario). Raises ``AssertionError``."""
        running, waiting = self.scheduler.running, self.scheduler.waiting
        self.block_pool.check_integrity(seq.block_table for seq in running)
        assert all(not seq.block_table for seq in waiting), "a waiting sequence holds pages"
        assert {s.request_id for s in running} | {s.request_id for s in waiting} == set(
            self._seqs
        ), "engine and scheduler disagree on live sequences"
        size = self.kv_manager.block_size
        for seq in running:
            assert len(seq.block_table) * size >= seq.num_computed_tokens
        outstanding = sum(max(s.reserved_blocks - len(s.block_table), 0) for s in running)
        assert outstanding == self.kv_manager.outstanding_blocks, "reservation ledger is off"
        assert outstanding <= self.block_pool.num_free_blocks, "reservations exceed free pages"

    # -- offline APIs -----------------------------------------------------------------------

    def add_tokens(
        self,
        request_id: str,
        prompt: list[list[int]],
        max_new_steps: int,
        sampling: SamplingParams | None = None,
    ) -> Sequence:
        """Queue a raw token request (rows of ``K`` ids); returns its live state, whose
        ``output_rows`` grow as the engine steps. It stops at one of the model's EOS ids or
        after ``max_new_steps``; its final output (no audio) comes from :meth:`step`."""
        vocab = self.model.vocab_size
        if self.layout.num_codebooks == 1 and any(not 0 <= row[0] < vocab for row in prompt if row):
            raise RequestRejected(f"prompt ids must lie in [0, {vocab})")
        seq = self._new_sequence(request_id, prompt, sampling or SamplingParams(), max_new_steps)
        seq.eos_ids = self.model.eos_ids
        frames = max_new_steps  # audio layouts: the most frames that fit in max_new_steps
        while frames > 0 and self.layout.steps_for_frames(frames) > max_new_steps:
            frames -= 1
        seq.target_frames = frames
        self._submit(seq)
        return seq

    def generate_ids(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        greedy: bool = True,
        seed: int | None = None,
    ) -> list[list[int]]:
        """Continue each prompt (token ids) by up to ``max_new_tokens``, stopping after an EOS
        id, as ``transformers``' ``generate`` does. Only for one-codebook models."""
        if self.layout.num_codebooks != 1:
            raise TypeError("generate_ids needs a one-token-per-step model")
        seqs = []
        for index, prompt in enumerate(prompts):
            params = SamplingParams(
                temperature=0.0 if greedy else 1.0,
                top_k=0,
                seed=None if seed is None else seed + index,
            )
            request_id = f"ids-{secrets.token_hex(6)}"
            seqs.append(self.add_tokens(request_id, [[t] for t in prompt], max_new_tokens, params))
        while any(seq.status is not SequenceStatus.FINISHED for seq in seqs):
            self.step()
        for seq in seqs:
            if seq.finish_reason is FinishReason.ERROR:
                raise RuntimeError(f"generation failed: {seq.error}")
        return [[row[0] for row in seq.output_rows] for seq in seqs]

    def synthesize(
        self,
        text: str,
        *,
        voice: str = "default",
        max_duration_s: float | None = None,
        sampling: SamplingParams | None = None,
    ) -> np.ndarray:
        """Offline: the whole utterance as float32 mono audio at :attr:`sample_rate`."""
        request_id = f"offline-{secrets.token_hex(6)}"
        request = SynthesisRequest(
            request_id, text, voice, max_duration_s, sampling or SamplingParams()
        )
        self.add_request(request)
        pieces: list[np.ndarray] = []
        while True:
            for output in self.step():
                if output.request_id != request_id:
                    continue
                pieces.append(output.audio)
                if output.finish_reason is FinishReason.ERROR:
                    raise RuntimeError(f"synthesis failed: {output.error}")
                if output.finished:
                    return np.concatenate(pieces) if pieces else _EMPTY_AUDIO

    # -- internals --------------------------------------------------------------------------

    def _new_sequence(
        self,
        request_id: str,
        prompt: list[list[int]],
        sampling: SamplingParams,
        max_new_steps: int,
        conditioning: str = "",
    ) -> Sequence:
        if request_id in self._seqs:
            raise RequestRejected(f"duplicate request id {request_id!r}")
        if len(self._seqs) >= self.config.max_pending_requests:
            raise RequestRejected("engine queue is full")
        if not prompt:
            raise RequestRejected("empty prompt")
        generator = torch.Generator(device=self.model.device)
        generator.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))
        seq = Sequence(
            request_id=request_id,
            token_rows=prompt,
            sampling=sampling,
            generator=generator,
            max_new_steps=max_new_steps,
            extra_keys=(*self._extra_keys, conditioning),
        )
        if self.kv_manager.reservation(seq) > self.block_pool.num_blocks:
            raise RequestRejected(
                f"request needs {self.kv_manager.reservation(seq)} KV pages; the cache has "
                f"{self.block_pool.num_blocks}"
            )
        if any(len(row) != self.layout.num_codebooks for row in prompt):
            raise RequestRejected("prompt rows do not match the model's codebooks")
        return seq

    def _submit(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def _forward(self, batch: ScheduledBatch) -> ForwardResult:
        try:
            return self.runner.execute(batch)
        except Exception:
            log.exception("batched forward failed; retrying each sequence alone")
        logits, sampling = [], []
        for seq, num_new in batch.items():
            alone = ScheduledBatch()
            if seq in batch.decodes:
                alone.decodes.append(seq)
            else:
                alone.prefills.append((seq, num_new))
            try:
                result = self.runner.execute(alone)
            except Exception as exc:
                self._fail(seq, exc)
                continue
            logits.append(result.logits)
            sampling.extend(result.sampling)
        if not logits:
            return ForwardResult(torch.empty(0), [])
        return ForwardResult(torch.cat(logits), sampling)

    def _advance(self, batch: ScheduledBatch, result: ForwardResult) -> None:
        for seq, num_new in batch.items():
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens += num_new
        keep = []
        has_nan = (
            torch.isnan(result.logits).flatten(1).any(dim=1).tolist() if result.sampling else []
        )
        for index, seq in enumerate(result.sampling):
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if has_nan[index]:
                self._fail(seq, RuntimeError("the model produced NaN logits"))
                continue
            keep.append(index)
        if keep:
            seqs = [result.sampling[i] for i in keep]
            constraints = [self.layout.constraints(seq) for seq in seqs]
            try:
                rows = sample_rows(result.logits[keep], seqs, self._masks, constraints)
            except Exception as exc:  # a sampler failure fails this step's samplers only
                for seq in seqs:
                    self._fail(seq, exc)
                rows, seqs = [], []
            finished: dict[Sequence, FinishReason] = {}
            for seq, row in zip(seqs, rows, strict=True):
                seq.append(row)
                reason = self.layout.on_row(seq, row)
                if reason is None and seq.num_generated >= seq.max_new_steps:
                    reason = FinishReason.LENGTH
                if reason is not None:
                    finished[seq] = reason
            decoded = self._decode_audio(seqs, finished)
            for seq in seqs:
                audio, codes = decoded.get(seq, (_EMPTY_AUDIO, None))
                if seq in finished:
                    self._finish(seq, finished[seq], audio, codes=codes)
                elif seq in decoded:
                    self._pending.append(StreamOutput(seq.request_id, audio, codes=codes))
        for seq, _ in batch.items():
            if seq.status is SequenceStatus.RUNNING:
                self.kv_manager.cache_full_blocks(seq)

    def _decode_audio(
        self, seqs: list[Sequence], finished: dict[Sequence, FinishReason]
    ) -> dict[Sequence, tuple[np.ndarray, np.ndarray]]:
        """Decode, in one batched call, every stream with a chunk's worth of new frames (the
        first chunk smaller, for a fast first audio) and every stream that just finished."""
        if self.decoder is None:
            return {}
        chunks, final, owners = {}, set(), {}
        pending = {seq: self.layout.frames_ready(seq) - seq.frames_sent for seq in seqs}

        def due(seq: Sequence) -> bool:
            first = seq.frames_sent == 0
            threshold = self.config.first_chunk_frames if first else self.config.chunk_frames
            return seq in finished or pending[seq] >= threshold

        # When any stream's chunk is due, streams at least a third of the way to theirs join
        # the same decoder call: the codec runs in large batches, and streams that decoded
        # together stay in phase, so the next calls are large too.
        join = any(due(seq) for seq in seqs)
        join_frames = max(1, self.config.chunk_frames // 3)
        for seq in seqs:
            complete = self.layout.frames_ready(seq)
            joins = join and seq.frames_sent > 0 and pending[seq] >= join_frames
            if seq.codec_slot is None or not (due(seq) or joins):
                continue
            codes = self.layout.frame_codes(seq, seq.frames_sent, complete)
            chunks[seq.codec_slot] = (
                torch.tensor(codes, dtype=torch.long).reshape(-1, self.layout.codebooks_per_frame).T
            )
            owners[seq.codec_slot] = seq
            seq.frames_sent = complete
            if seq in finished:
                final.add(seq.codec_slot)
        if not chunks:
            return {}
        started = time.perf_counter()
        decoded = self.decoder.decode(chunks, frozenset(final))
        now = time.monotonic()
        self.codec_seconds += time.perf_counter() - started
        self.codec_frames += sum(int(codes.shape[1]) for codes in chunks.values())
        for slot, seq in owners.items():
            if seq.playout is not None and chunks[slot].shape[1] > 0:
                first_frame = seq.frames_sent - int(chunks[slot].shape[1])
                self.chunk_slacks_s.append(seq.playout.delivered(first_frame, now))
        for slot in final:
            self._free_codec_slots.append(slot)
            owners[slot].codec_slot = None
        return {
            owners[slot]: (
                pcm.clamp(-1.0, 1.0).cpu().numpy(),
                chunks[slot].T.numpy().astype(np.uint16),
            )
            for slot, pcm in decoded.items()
        }

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        audio: np.ndarray,
        error: str | None = None,
        codes: np.ndarray | None = None,
    ) -> None:
        self.scheduler.finish(seq)
        if seq.codec_slot is not None:  # cancelled or failed mid-stream: no flush
            self._streaming_decoder().release(seq.codec_slot)
            self._free_codec_slots.append(seq.codec_slot)
            seq.codec_slot = None
        seq.finish_reason, seq.error = reason, error
        self._seqs.pop(seq.request_id, None)
        self._pending.append(StreamOutput(seq.request_id, audio, reason, error, codes))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        log.error("request %s failed: %s", seq.request_id, exc)
        self._finish(seq, FinishReason.ERROR, _EMPTY_AUDIO, f"{type(exc).__name__}: {exc}")

    def _streaming_decoder(self) -> StreamingDecoder:
        if self.decoder is None:
            raise TypeError(f"{self.model_name} produces no audio")
        return self.decoder

    def _codec(self) -> EncodecCodec:
        if self.codec is None:
            raise TypeError(f"{self.model_name} has no codec")
        return self.codec


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu. Raises ``ValueError`` for cuda without GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available")
    return torch.device(device)


_KV_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
}


def resolve_kv_dtype(kv_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """``"auto"`` -> the model's dtype; otherwise the named one (int8: quantized pages)."""
    return model_dtype if kv_dtype == "auto" else _KV_DTYPES[kv_dtype]


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` -> float32 on cpu (no fast bf16 there), bfloat16 on cuda."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
