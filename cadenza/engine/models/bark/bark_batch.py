"""Bark for many streams at once. Each stream goes through the three stages in turn; one
:meth:`BarkBatch.step` advances every stream by one unit of work in its stage, batched with the
other streams in the same stage:

- **semantic**: the prompt (text and voice history summed, then the infer token) in chunks of
  ``prefill_chunk`` positions, one chunk per step; then one token per step, all decoding streams
  in one forward pass; ends at the end token (or when ``min_eos_p`` forces it) or the limit;
- **coarse**: Bark's sliding windows, each a fresh prompt (so nothing is reused between windows:
  a window's positions start at 0 and its prompt's semantic part moves), prefilled in chunks and
  decoded like the semantic stage, the two codebooks alternating;
- **fine**: once the coarse codes are complete, one 1024-frame window per step for every such
  stream in one forward pass per codebook; then the stream's audio is decoded by EnCodec.

Streams join and leave between steps. Every stream samples from its own seeded generator, so
what it draws does not depend on the batch it ran in; temperatures of ``None`` are greedy.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from cadenza.engine.models.bark.bark_checkpoint import BarkCheckpoint
from cadenza.engine.models.bark.bark_gpt import BarkCausalGPT, StageKV
from cadenza.engine.models.bark.bark_request import (
    BarkChunk,
    BarkRequest,
    BarkRequestError,
    BarkResult,
)
from cadenza.engine.models.bark.bark_step_cost import StepWork
from cadenza.engine.models.bark.bark_voices import VoicePreset
from cadenza.engine.models.bark.bark_windows import (
    CoarseHistory,
    FineWindows,
    coarse_allowed,
    coarse_codes,
    coarse_history,
    coarse_tokens_for,
    coarse_window_prompt,
    fine_windows,
    semantic_prompt,
)


class _Stage(Enum):
    SEMANTIC = "semantic"
    COARSE = "coarse"
    FINE = "fine"


@dataclass
class _CausalRun:
    """One prompt and its continuation in a causal stage's KV slot."""

    slot: int
    prompt: torch.Tensor  # [P, H] embeddings
    cached: int = 0
    tokens: list[int] = field(default_factory=list)

    @property
    def prefilled(self) -> bool:
        return self.cached >= self.prompt.shape[0]


@dataclass
class _Stream:
    id: int
    request: BarkRequest
    voice: VoicePreset | None
    generator: torch.Generator
    stage: _Stage = _Stage.SEMANTIC
    run: _CausalRun | None = None
    semantic: list[int] = field(default_factory=list)
    history: CoarseHistory = field(default_factory=lambda: CoarseHistory([], []))
    coarse: list[int] = field(default_factory=list)  # the history's, then generated
    coarse_target: int = 0
    fine: FineWindows | None = None  # laid out once the semantic tokens are known
    window: int = 0
    decoder_slot: int = -1
    emitted: int = 0  # frames decoded into audio
    audio: list[torch.Tensor] = field(default_factory=list)

    @property
    def coarse_generated(self) -> int:
        return len(self.coarse) - len(self.history.coarse)


class BarkBatch:
    """Streams of one Bark checkpoint, advanced together (see the module's docstring)."""

    def __init__(
        self, bark: BarkCheckpoint, *, prefill_chunk: int = 128, max_streams: int = 64
    ) -> None:
        if prefill_chunk < 1 or max_streams < 1:
            raise ValueError("prefill_chunk and max_streams must be at least 1")
        self.max_streams = max_streams
        self._decoder = bark.codec.streaming_decoder(max_streams)
        self.bark = bark
        self.prefill_chunk = prefill_chunk
        param = next(bark.semantic.parameters())
        self._device, self._dtype = param.device, param.dtype
        self.semantic_kv = self._kv(bark.semantic)
        self.coarse_kv = self._kv(bark.coarse)
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count()
        self.seconds = {stage.value: 0.0 for stage in _Stage} | {"codec": 0.0}
        """Wall seconds spent in each stage's work and in EnCodec, since the batch began."""
        self.last_work = StepWork()
        """What the latest :meth:`step` did."""

    def _kv(self, model: BarkCausalGPT) -> StageKV:
        return StageKV(model.shape, model.shape.block_size, self._device, self._dtype)

    @property
    def active(self) -> int:
        return len(self._streams)

    @property
    def codec_slots_in_use(self) -> int:
        """Streams holding a slot of the streaming EnCodec decoder."""
        return len(self._decoder.open_slots)

    def stage_of(self, stream_id: int) -> str | None:
        """The stage a stream is in (``None``: finished, cancelled or unknown)."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.stage.value

    def stage_counts(self) -> dict[str, int]:
        """How many streams are in each stage."""
        counts = {stage.value: 0 for stage in _Stage}
        for stream in self._streams.values():
            counts[stream.stage.value] += 1
        return counts

    def add(self, request: BarkRequest) -> int:
        """Start a stream; its id. Raises :class:`BarkRequestError` for a voice not among the
        checkpoint's presets, an empty text or one longer than the semantic stage reads, or a
        setting out of range."""
        constants = self.bark.constants
        if len(self._streams) >= self.max_streams:
            raise BarkRequestError(f"the batch holds {self.max_streams} streams", "streams")
        request.sampling.check(constants.max_new_semantic_tokens)
        voice = None
        if request.voice is not None:
            voice = self.bark.voices.get(request.voice)
            if voice is None:
                known = ", ".join(sorted(self.bark.voices)) or "none"
                raise BarkRequestError(
                    f"voice {request.voice!r} not found; voices: {known}", "voice"
                )
        if not isinstance(request.text, str) or not request.text.strip():
            raise BarkRequestError("text must not be empty", "text")
        ids = self.bark.tokenizer(request.text, add_special_tokens=False)["input_ids"]
        if len(ids) > constants.max_input_semantic_length:
            raise BarkRequestError(
                f"text is {len(ids)} tokens; Bark reads at most "
                f"{constants.max_input_semantic_length}",
                "text",
            )
        stream_id = next(self._ids)
        generator = torch.Generator().manual_seed(request.sampling.seed)
        stream = _Stream(stream_id, request, voice, generator)
        text, history = semantic_prompt(list(ids), voice, constants)
        embed = self.bark.semantic.input_embeds_layer
        with torch.inference_mode():
            rows = embed(text.to(self._device)) + embed(history.to(self._device))
            infer = embed(torch.tensor([constants.semantic_infer_token], device=self._device))
        stream.run = _CausalRun(self.semantic_kv.take(), torch.cat([rows, infer]))
        self._streams[stream_id] = stream
        return stream_id

    def cancel(self, stream_id: int) -> None:
        """Drop a stream and free its KV slot (unknown ids are ignored)."""
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        if stream.run is not None:
            self._kv_of(stream).give_back(stream.run.slot)
        if stream.decoder_slot >= 0:
            self._decoder.release(stream.decoder_slot)

    def _kv_of(self, stream: _Stream) -> StageKV:
        return self.semantic_kv if stream.stage is _Stage.SEMANTIC else self.coarse_kv

    def steps_to_audio(self, stream_id: int) -> int | None:
        """At most how many steps the stream needs until its next audio: the coarse tokens up
        to the end of its next fine window, the prompt chunks of the coarse windows that make
        them (each at most a full prompt), and the fine step. ``None`` while its semantic
        tokens run (how many frames it makes is not known yet) or for an unknown stream."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.fine is None:
            return None
        constants, fine = self.bark.constants, stream.fine
        if stream.window == len(fine.windows):
            return 1
        start, _ = fine.windows[stream.window]
        needed = min(fine.frames, start + constants.max_fine_input_length - fine.history)
        tokens = max(needed - fine.coarse_frames, 0) * constants.n_coarse_codebooks
        windows = math.ceil(tokens / constants.sliding_window_len)
        prompt = constants.max_coarse_input_length + 1 + constants.max_coarse_history
        return tokens + windows * math.ceil(prompt / self.prefill_chunk) + 1

    @torch.inference_mode()
    def step(self, resting: frozenset[int] = frozenset()) -> list[BarkChunk]:
        """Advance every stream but the ``resting`` ones by one unit of work; the audio made,
        with the results of the streams that finished."""
        by_stage: dict[_Stage, list[_Stream]] = {stage: [] for stage in _Stage}
        for stream in self._streams.values():
            if stream.id not in resting:
                by_stage[stream.stage].append(stream)
        started = time.perf_counter()
        work = self.last_work = StepWork()
        semantic = self._causal_step(
            self.bark.semantic, self.semantic_kv, by_stage[_Stage.SEMANTIC]
        )
        work.semantic_decodes, work.semantic_chunks, work.semantic_rows = semantic
        semantic_done = time.perf_counter()
        coarse = self._causal_step(self.bark.coarse, self.coarse_kv, by_stage[_Stage.COARSE])
        work.coarse_decodes, work.coarse_chunks, work.coarse_rows = coarse
        coarse_done = time.perf_counter()
        self.seconds["semantic"] += semantic_done - started
        self.seconds["coarse"] += coarse_done - semantic_done
        return self._fine_step([s for s in self._streams.values() if s.id not in resting])

    def run(self) -> list[BarkResult]:
        """Step until every stream has finished; their results in the order they finished."""
        results: list[BarkResult] = []
        while self._streams:
            results.extend(chunk.result for chunk in self.step() if chunk.result is not None)
        return results

    # -- the causal stages ---------------------------------------------------------------

    def _causal_step(
        self, model: BarkCausalGPT, kv: StageKV, streams: list[_Stream]
    ) -> tuple[int, int, int]:
        """One stage's work for its streams; the streams that decoded, the prompt chunks
        prefilled and their rows."""
        rows = 0
        # Taken before any token: a stream whose stage ends here opens its next run at once,
        # which belongs to the next stage's step, not to this one.
        decoding = [s for s in streams if s.run is not None and s.run.prefilled]
        prefilling = [s for s in streams if s.run is not None and not s.run.prefilled]
        if decoding:
            runs = [s.run for s in decoding if s.run is not None]
            ids = torch.tensor([run.tokens[-1] for run in runs], device=self._device)
            slots = torch.tensor([run.slot for run in runs], device=self._device)
            past = torch.tensor([run.cached for run in runs], device=self._device)
            logits = model(model.input_embeds_layer(ids)[:, None], slots, past, kv)
            for stream, run, row in zip(decoding, runs, logits, strict=True):
                run.cached += 1
                self._take_token(stream, row)
        for stream in prefilling:
            prefill = stream.run
            assert prefill is not None
            chunk = prefill.prompt[prefill.cached : prefill.cached + self.prefill_chunk]
            slot = torch.tensor([prefill.slot], device=self._device)
            past = torch.tensor([prefill.cached], device=self._device)
            logits = model(chunk[None], slot, past, kv)
            prefill.cached += chunk.shape[0]
            rows += chunk.shape[0]
            if prefill.prefilled:
                self._take_token(stream, logits[0])
        return len(decoding), len(prefilling), rows

    def _take_token(self, stream: _Stream, logits: torch.Tensor) -> None:
        if stream.stage is _Stage.SEMANTIC:
            self._take_semantic(stream, logits)
        else:
            self._take_coarse(stream, logits)

    def _take_semantic(self, stream: _Stream, logits: torch.Tensor) -> None:
        constants, sampling, run = self.bark.constants, stream.request.sampling, stream.run
        assert run is not None
        end = constants.semantic_end_token
        allowed = logits[: end + 1]
        token = None
        if (
            sampling.min_eos_p is not None
            and float(torch.softmax(allowed, dim=-1)[end]) > sampling.min_eos_p
        ):
            token = end
        if token is None:
            token = _pick(allowed, sampling.semantic_temperature, stream.generator)
        run.tokens.append(token)
        limit = sampling.max_semantic_tokens or constants.max_new_semantic_tokens
        if token == end or len(run.tokens) >= limit:
            stream.semantic = [t for t in run.tokens if t != end]
            self.semantic_kv.give_back(run.slot)
            stream.run = None
            stream.stage = _Stage.COARSE
            stream.history = coarse_history(stream.voice, constants)
            stream.coarse = list(stream.history.coarse)
            stream.coarse_target = coarse_tokens_for(len(stream.semantic), constants)
            frames = stream.coarse_target // constants.n_coarse_codebooks
            stream.fine = fine_windows(frames, stream.voice, constants)
            stream.decoder_slot = self._decoder.open()
            self._next_coarse_window(stream)

    def _next_coarse_window(self, stream: _Stream) -> None:
        """Open the stream's next coarse window, or move it to the fine stage."""
        constants = self.bark.constants
        if stream.coarse_generated >= stream.coarse_target:
            stream.stage = _Stage.FINE
            return
        semantic = stream.history.semantic + stream.semantic
        prompt = coarse_window_prompt(
            semantic,
            len(stream.history.semantic),
            stream.coarse,
            stream.coarse_generated,
            constants,
        )
        with torch.inference_mode():
            embeds = self.bark.coarse.input_embeds_layer(torch.tensor(prompt, device=self._device))
        stream.run = _CausalRun(self.coarse_kv.take(), embeds)

    def _take_coarse(self, stream: _Stream, logits: torch.Tensor) -> None:
        constants, run = self.bark.constants, stream.run
        assert run is not None
        low, high = coarse_allowed(len(run.tokens), constants, logits.shape[0])
        token = low + _pick(
            logits[low:high], stream.request.sampling.coarse_temperature, stream.generator
        )
        run.tokens.append(token)
        window = min(constants.sliding_window_len, stream.coarse_target - stream.coarse_generated)
        if len(run.tokens) >= window:
            assert stream.fine is not None
            stream.fine.put_coarse(coarse_codes(run.tokens, constants))
            stream.coarse.extend(run.tokens)
            self.coarse_kv.give_back(run.slot)
            stream.run = None
            self._next_coarse_window(stream)

    # -- the fine stage ------------------------------------------------------------------

    def _fine_step(self, streams: list[_Stream]) -> list[BarkChunk]:
        """Run the next fine window of every one of ``streams`` whose coarse codes reach its
        end, then decode the frames no later window changes."""
        started = time.perf_counter()
        constants = self.bark.constants
        width = constants.max_fine_input_length
        working: list[tuple[_Stream, FineWindows, int, int]] = []
        for stream in streams:
            fine = stream.fine
            if fine is None or stream.window == len(fine.windows):
                continue
            if fine.ready(stream.window, width):
                start, fill = fine.windows[stream.window]
                working.append((stream, fine, start, fill - start))
        if not working:
            return []
        inputs = torch.stack([fine.buffer[start : start + width] for _, fine, start, _ in working])
        inputs = inputs.to(self._device)
        for codebook in range(constants.n_coarse_codebooks, constants.n_fine_codebooks):
            logits = self.bark.fine(inputs, codebook)[:, :, : constants.codebook_size]
            for row, (stream, _, _, fill) in enumerate(working):
                temperature = stream.request.sampling.fine_temperature
                inputs[row, fill:, codebook] = _pick_rows(
                    logits[row, fill:], temperature, stream.generator
                )
        for row, (stream, fine, start, fill) in enumerate(working):
            fine.buffer[start + fill : start + width] = inputs[row, fill:].cpu()
            stream.window += 1
        self.last_work.fine_windows = len(working)
        fine_done = time.perf_counter()
        chunks = self._decode([stream for stream, _, _, _ in working])
        self.seconds["codec"] += time.perf_counter() - fine_done
        self.seconds["fine"] += fine_done - started
        return chunks

    def _decode(self, streams: list[_Stream]) -> list[BarkChunk]:
        """Decode each stream's newly final frames, all in one streaming-decoder call; finish
        the streams whose last window has run."""
        codes: dict[int, torch.Tensor] = {}
        last: set[int] = set()
        for stream in streams:
            fine = stream.fine
            assert fine is not None
            final = fine.final_after(stream.window - 1)
            done = stream.window == len(fine.windows)
            if final > stream.emitted or done:
                codes[stream.decoder_slot] = fine.codes[:, stream.emitted : final]
            stream.emitted = final
            if done:
                last.add(stream.decoder_slot)
        audio = self._decoder.decode(codes, frozenset(last))
        self.last_work.codec_streams = len(codes)
        self.last_work.codec_frames = sum(int(frames.shape[1]) for frames in codes.values())
        chunks = []
        for stream in streams:
            piece = audio.get(stream.decoder_slot, torch.zeros(0)).cpu()
            stream.audio.append(piece)
            frames = codes.get(stream.decoder_slot)
            result = self._finish(stream) if stream.decoder_slot in last else None
            chunks.append(
                BarkChunk(stream.id, piece, result, None if frames is None else frames.T.cpu())
            )
        return chunks

    def _finish(self, stream: _Stream) -> BarkResult:
        del self._streams[stream.id]
        stream.decoder_slot = -1  # closed by its final chunk
        assert stream.fine is not None
        generated = stream.coarse[len(stream.history.coarse) :]
        coarse = coarse_codes(generated, self.bark.constants).T.contiguous()
        audio = torch.cat(stream.audio)
        return BarkResult(stream.id, stream.semantic, coarse, stream.fine.codes, audio)


def _pick(logits: torch.Tensor, temperature: float | None, generator: torch.Generator) -> int:
    """The index of ``logits [V]``'s largest (``None``) or a draw at ``temperature``."""
    if temperature is None:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _pick_rows(
    logits: torch.Tensor, temperature: float | None, generator: torch.Generator
) -> torch.Tensor:
    """Per row of ``logits [T, V]``: the largest's index, or a draw at ``temperature``."""
    if temperature is None:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0].to(logits.device)
