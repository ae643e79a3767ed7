"""The engine: text in, audio chunks out, one step at a time.

This is the skeleton loop: streams are served one at a time in arrival order, each with a
contiguous KV cache, and audio is decoded per stream in chunks. The paged, continuously batched
engine replaces the inside of :meth:`Engine.step` behind the same interface
(``add_request`` / ``abort_request`` / ``step`` / ``has_unfinished_requests``).

A stream's life: prefill the text prompt, then one decode step per delay-pattern row; frames
complete ``K - 1`` steps after they start; every ``chunk_frames`` complete frames (fewer for the
first chunk, for a fast time to first audio) are decoded to audio and returned.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.codecs.encodec import EncodecCodec, load_codec
from cadenza.codecs.windowed_decoder import WindowedChunkDecoder
from cadenza.config import EngineConfig, LimitsConfig
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel
from cadenza.engine.models.registry import load_model
from cadenza.engine.request import FinishReason, StreamOutput, SynthesisRequest, derive_duration_s
from cadenza.engine.sampler import sample_row
from cadenza.engine.sampling_params import SamplingParams
from cadenza.engine.sequence_kv_cache import SequenceKVCache
from cadenza.engine.text_tokenizer import ByteTokenizer

log = logging.getLogger(__name__)

_EMPTY_AUDIO = np.zeros(0, dtype=np.float32)


class RequestRejected(ValueError):
    """The engine will not take this request (unknown voice, duplicate id, queue full)."""


@dataclass
class _Stream:
    """Generation state of one request."""

    request: SynthesisRequest
    target_frames: int
    generator: torch.Generator
    decoder: WindowedChunkDecoder
    kv_cache: SequenceKVCache | None = None
    rows: list[list[int]] = field(default_factory=list)
    end_frame: int | None = None
    frames_sent: int = 0


class Engine:
    def __init__(
        self,
        model: CadenzaTinyModel,
        codec: EncodecCodec,
        *,
        model_name: str,
        engine_config: EngineConfig | None = None,
        limits: LimitsConfig | None = None,
    ) -> None:
        spec = model.spec
        if codec.num_codebooks != spec.num_codebooks or codec.codebook_size != spec.codebook_size:
            raise ValueError("model and codec disagree on codebooks")
        self.model = model
        self.codec = codec
        self.model_name = model_name
        self.config = engine_config or EngineConfig()
        self.limits = limits or LimitsConfig()
        self.tokenizer = ByteTokenizer()
        self.pattern = spec.delay_pattern
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._pending_outputs: list[StreamOutput] = []
        allowed = torch.zeros(spec.num_codebooks, spec.audio_vocab_size, dtype=torch.bool)
        allowed[:, : spec.codebook_size] = True
        allowed[0, spec.eos_id] = True
        self._allowed = allowed.to(model.heads.weight.device)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "cadenza-tiny",
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        engine_config: EngineConfig | None = None,
        limits: LimitsConfig | None = None,
    ) -> Engine:
        """Build the model and its codec on ``device`` (``"auto"``: cuda if available)."""
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        model = load_model(name_or_path, seed=seed).to(device=torch_device, dtype=torch_dtype)
        codec = load_codec(model.spec.codec_name, device=torch_device, seed=seed)
        return cls(
            model, codec, model_name=name_or_path, engine_config=engine_config, limits=limits
        )

    # -- identity ---------------------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return self.codec.sample_rate

    @property
    def frame_rate(self) -> float:
        return self.codec.frame_rate

    @property
    def voices(self) -> tuple[str, ...]:
        return self.model.spec.voices

    # -- request lifecycle ------------------------------------------------------------------

    def add_request(self, request: SynthesisRequest) -> None:
        """Queue a stream. Raises :class:`RequestRejected` without changing any state."""
        if request.request_id in self._streams:
            raise RequestRejected(f"duplicate request id {request.request_id!r}")
        if request.voice not in self.voices:
            raise RequestRejected(f"unknown voice {request.voice!r}; voices: {self.voices}")
        if len(self._streams) >= self.config.max_pending_requests:
            raise RequestRejected("engine queue is full")
        duration_s = derive_duration_s(
            request.text,
            request.max_duration_s,
            chars_per_second=self.limits.chars_per_second,
            min_duration_s=self.limits.min_duration_s,
            server_max_duration_s=self.limits.max_duration_s,
        )
        seed = request.sampling.seed
        generator = torch.Generator(device=self._allowed.device)
        generator.manual_seed(seed if seed is not None else secrets.randbits(63))
        self._streams[request.request_id] = _Stream(
            request=request,
            target_frames=max(0, round(duration_s * self.frame_rate)),
            generator=generator,
            decoder=WindowedChunkDecoder(self.codec),
        )

    def abort_request(self, request_id: str) -> bool:
        """Stop a stream; its last output (``CANCELLED``) comes from the next :meth:`step`."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        self._pending_outputs.append(StreamOutput(request_id, _EMPTY_AUDIO, FinishReason.CANCELLED))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._streams) or bool(self._pending_outputs)

    @property
    def num_requests(self) -> int:
        return len(self._streams)

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[StreamOutput]:
        """Advance the oldest stream by one token step; return the outputs that are ready."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if not self._streams:
            return outputs
        stream = next(iter(self._streams.values()))
        request_id = stream.request.request_id
        try:
            with torch.inference_mode():
                output = self._advance(stream)
        except Exception as exc:  # a failing request fails alone
            log.exception("request %s failed", request_id)
            output = StreamOutput(request_id, _EMPTY_AUDIO, FinishReason.ERROR, str(exc))
        if output is not None:
            outputs.append(output)
            if output.finished:
                self._streams.pop(request_id, None)
        return outputs

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

    def _advance(self, stream: _Stream) -> StreamOutput | None:
        if stream.target_frames == 0:
            return StreamOutput(stream.request.request_id, _EMPTY_AUDIO, FinishReason.LENGTH)
        logits = self._prefill(stream) if stream.kv_cache is None else self._decode(stream)
        step = len(stream.rows)
        forced = self.pattern.forced_ids(step, stream.end_frame)
        row = sample_row(logits, self._allowed, forced, stream.request.sampling, stream.generator)
        stream.rows.append(row)
        finish_reason = None
        if stream.end_frame is None:
            if row[0] == self.model.spec.eos_id:
                stream.end_frame, finish_reason = step, FinishReason.EOS
            elif step + 1 >= stream.target_frames:
                stream.end_frame, finish_reason = stream.target_frames, FinishReason.LENGTH
        else:
            finish_reason = (
                FinishReason.EOS if stream.end_frame < stream.target_frames else FinishReason.LENGTH
            )
        done = stream.end_frame is not None and len(stream.rows) >= self.pattern.steps_needed(
            stream.end_frame
        )
        audio = self._take_audio(stream, final=done)
        if done:
            return StreamOutput(
                stream.request.request_id,
                audio if audio is not None else _EMPTY_AUDIO,
                finish_reason,
            )
        if audio is None:
            return None
        return StreamOutput(stream.request.request_id, audio)

    def _prefill(self, stream: _Stream) -> torch.Tensor:
        prompt = self.model.prompt_rows(self.tokenizer.encode(stream.request.text))
        max_tokens = len(prompt) + self.pattern.steps_needed(stream.target_frames)
        stream.kv_cache = self.model.new_kv_cache(max_tokens)
        device = self._allowed.device
        positions = torch.arange(len(prompt), device=device)
        logits = self.model(prompt.to(device), positions, stream.kv_cache)
        return logits[-1]

    def _decode(self, stream: _Stream) -> torch.Tensor:
        assert stream.kv_cache is not None
        device = self._allowed.device
        row = torch.tensor([stream.rows[-1]], device=device)
        position = torch.tensor([stream.kv_cache.num_tokens], device=device)
        return self.model(row, position, stream.kv_cache)[0]

    def _take_audio(self, stream: _Stream, *, final: bool) -> np.ndarray | None:
        complete = self.pattern.frames_complete(len(stream.rows))
        if stream.end_frame is not None:
            complete = min(complete, stream.end_frame)
        pending = complete - stream.frames_sent
        threshold = (
            self.config.first_chunk_frames if stream.frames_sent == 0 else self.config.chunk_frames
        )
        if pending <= 0 or (pending < threshold and not final):
            return None
        codes = torch.tensor(
            [
                self.pattern.frame_codes(stream.rows, frame)
                for frame in range(stream.frames_sent, complete)
            ],
            dtype=torch.long,
        ).T
        audio = stream.decoder.decode(codes)
        stream.frames_sent = complete
        return audio.clamp(-1.0, 1.0).cpu().numpy()


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu. Raises ``ValueError`` for cuda without GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` -> float32 on cpu (no fast bf16 there), bfloat16 on cuda."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
