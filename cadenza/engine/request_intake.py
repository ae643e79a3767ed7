"""Request intake: a :class:`SynthesisRequest` (or a raw token prompt) becomes a
:class:`Sequence`, or is refused with :class:`RequestRejected` before anything changes.

For speech: the voice must exist; the stream's length comes from its text and the limits
(:mod:`cadenza.contract.stream_length`); a speech prompt (microphone audio at the codec's rate)
and the conversation turns' audio are encoded into codec frames that the model's prompt places
before the text; the sequence gets its own seeded generator, its prefix-cache keys (model,
dtypes, and what the model says its KV depends on besides the rows: the voice, or the text
too), its playout clock and, for a stateful model, what the model conditions on (the text, the
turns' transcripts and the prompt's audio frames; its state is made when the stream first
runs).
Model-specific sampling fields the model does not take are refused by name.

A resumed request (one whose engine was lost mid-stream, see
:class:`~cadenza.contract.request.ResumePoint`) becomes the sequence it was: its generated rows
are replayed through the layout (so the frame count and ending are where they were; each one
also advances the stream's draw counter, so the next draw is the one it would have made:
:mod:`cadenza.engine.stream_draws`); the whole of prompt plus rows is prefilled, and the next
row sampled is the next the stream would have produced. Its playout clock starts over at the
frames already heard.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np
import torch

from cadenza.codecs.codec import AudioCodec, CodecError
from cadenza.config import LimitsConfig, RealtimeConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams, check_model_fields
from cadenza.contract.stream_length import StreamLength, request_duration_s, stream_length
from cadenza.engine.layouts.token_layout import ContextRestarts, layout_steps_for_frames
from cadenza.engine.models.model import AudioTokenModel, PromptTurn
from cadenza.engine.models.stream_state import StreamConditioning
from cadenza.engine.realtime.playout_clock import PlayoutClock
from cadenza.engine.sequence import AudioProgress, Sequence

ENCODED_TURNS_KEPT = 64  # conversation turns whose encoded audio is remembered


class RequestIntake:
    def __init__(
        self,
        model: AudioTokenModel,
        codec: AudioCodec | None,
        *,
        extra_keys: tuple[str, ...],
        realtime: RealtimeConfig,
        limits: LimitsConfig,
    ) -> None:
        self.model = model
        self.codec = codec
        self.layout = model.layout
        self.extra_keys = extra_keys
        self.realtime = realtime
        self.limits = limits
        # How long after its arrival a stream with this many prompt rows has its first chunk
        # due (the engine's RealtimePlan, which knows the calibration); the TTFA target until
        # the engine sets it.
        self.first_chunk_due_after_s: Callable[[int], float] = lambda rows: (
            realtime.ttfa_target_ms / 1000.0
        )
        self._encoded: OrderedDict[bytes, list[list[int]]] = OrderedDict()

    def speech(self, request: SynthesisRequest) -> Sequence:
        """The sequence that speaks ``request``. Raises :class:`RequestRejected`."""
        if not self.layout.produces_audio or self.codec is None:
            raise RequestRejected("this is a text model; it cannot synthesize")
        if request.voice not in self.model.voices:
            raise RequestRejected(
                f"unknown voice {request.voice!r}; voices: {', '.join(self.model.voices)}"
            )
        try:
            check_model_fields(request.sampling, self.model.sampling_fields, self.model.family)
            self.model.check_request(request.text, request.sampling)
        except ValueError as exc:  # UnsupportedSamplingField among them
            raise RequestRejected(str(exc)) from exc
        duration_s = request_duration_s(
            request.text, request.max_duration_s, self.limits, self.model.default_duration_s
        )
        length = stream_length(duration_s, self.codec.frame_rate, self.layout)
        prompt_codes = self._prompt_codes(request)
        if request.context:
            turns = self._context(request)
            if prompt_codes:  # a speech prompt is the speaker's own last turn, untranscribed
                turns.append((request.voice, "", prompt_codes))
            prompt = self._prompt(
                lambda: self.model.build_prompt_with_context(request.text, request.voice, turns)
            )
        else:
            turns = [(request.voice, "", prompt_codes)] if prompt_codes else []
            prompt = self._prompt(
                lambda: self.model.build_prompt(request.text, request.voice, prompt_codes)
            )
        length = self._fit_positions(len(prompt), length)
        conditioning = StreamConditioning(
            request.text,
            request.voice,
            request.sampling,
            context_texts=tuple(turn.text for turn in request.context),
            context_frames=tuple(tuple(frame) for _, _, frames in turns for frame in frames),
        )
        seq = self._sequence(
            request.request_id,
            prompt,
            request.sampling,
            max_new_steps=length.steps,
            conditioning=self.model.prefix_conditioning(conditioning),
        )
        if self.model.keeps_stream_state:
            seq.conditioning = conditioning
        if isinstance(self.layout, ContextRestarts):
            seq.max_context = self.layout.max_context
        seq.target_frames = length.frames
        seq.audio = AudioProgress(
            PlayoutClock(
                arrival_s=time.monotonic(),
                ttfa_target_s=self.first_chunk_due_after_s(len(prompt)),
                frame_period_s=1.0 / self.codec.frame_rate,
                reserve_s=self.realtime.playout_reserve_ms / 1000.0,
            )
        )
        if request.resume is not None:
            self._resume(seq, request.resume)
        return seq

    def tokens(
        self,
        request_id: str,
        prompt: list[list[int]],
        max_new_steps: int,
        sampling: SamplingParams,
    ) -> Sequence:
        """A raw token request (rows of ``K`` ids) that stops at one of the model's EOS ids or
        after ``max_new_steps``; an audio layout gets the most frames that fit in them."""
        if self.model.keeps_stream_state:
            raise RequestRejected("this model conditions on text: it takes speech requests only")
        vocab = self.model.vocab_size
        if self.layout.num_codebooks == 1 and any(not 0 <= row[0] < vocab for row in prompt if row):
            raise RequestRejected(f"prompt ids must lie in [0, {vocab})")
        seq = self._sequence(request_id, prompt, sampling, max_new_steps)
        seq.eos_ids = self.model.eos_ids | frozenset(sampling.stop_ids)
        frames = max_new_steps
        while frames > 0 and layout_steps_for_frames(self.layout, frames) > max_new_steps:
            frames -= 1
        seq.target_frames = frames
        return seq

    def _fit_positions(self, prompt_len: int, length: StreamLength) -> StreamLength:
        """``length``, fewer frames if the model's positions end sooner (the stream then ends
        with ``length`` there); refused when the prompt leaves no room for a frame."""
        limit = self.model.max_positions
        if limit is None or prompt_len + length.steps <= limit:
            return length
        frames = length.frames
        while frames > 0 and prompt_len + layout_steps_for_frames(self.layout, frames) > limit:
            frames -= 1
        if frames == 0 and length.frames > 0:
            raise RequestRejected(
                f"the prompt takes {prompt_len} of the model's {limit} positions and leaves "
                "no room to speak; shorten the text or the conversation context"
            )
        return StreamLength(frames, layout_steps_for_frames(self.layout, frames))

    def _resume(self, seq: Sequence, point: ResumePoint) -> None:
        """Bring ``seq`` to where ``point`` says its stream was; :class:`RequestRejected`
        when the rows cannot be this model's output for this request."""
        assert seq.audio is not None
        if isinstance(self.layout, ContextRestarts):
            self._resume_from_start(seq, point)
            return
        if self.model.samples_rows:
            self._resume_own_rows(seq, point)
            return
        width = self.layout.num_codebooks
        masks = self.layout.sampling_masks()
        vocab = self.model.vocab_size if masks is None else int(masks.shape[-1])
        for row in point.rows:
            if len(row) != width or any(not 0 <= token < vocab for token in row):
                raise RequestRejected("resume rows do not fit this model's vocabulary")
            mask_index, forced = self.layout.constraints(seq)
            for k, token in enumerate(row):
                if forced is not None and forced[k] is not None:
                    possible = token == forced[k]
                else:
                    possible = masks is None or bool(masks[mask_index, k, token])
                if not possible:
                    raise RequestRejected(
                        f"resume rows hold id {token}, which the model could not emit there"
                    )
            # Appended, the row advances the stream's draw counter: its next draw is the one
            # it would have made (cadenza.engine.stream_draws).
            self._append_resumed(seq, row)
        self._resume_at(seq, point)

    def _resume_own_rows(self, seq: Sequence, point: ResumePoint) -> None:
        """:meth:`_resume` for a model that samples its own rows: it checks each row and
        replays its draws."""
        for row in point.rows:
            if len(row) != self.layout.num_codebooks:
                raise RequestRejected("resume rows do not fit this model's rows")
            try:
                self.model.replay_row(seq, list(row))
            except ValueError as exc:
                raise RequestRejected(f"resume rows: {exc}") from exc
            self._append_resumed(seq, row)
        self._resume_at(seq, point)

    def _append_resumed(self, seq: Sequence, row: Iterable[int]) -> None:
        seq.append(list(row))
        seq.end_frame, reason = self.layout.on_row(seq, list(row))
        if reason is not None or seq.num_generated >= seq.max_new_steps:
            raise RequestRejected("the resumed stream had already ended")

    def _resume_at(self, seq: Sequence, point: ResumePoint) -> None:
        """The resumed ``seq``'s playout: ``point``'s frames heard, its rows sent."""
        assert seq.audio is not None
        if not 0 <= point.frames_sent <= self.layout.frames_ready(seq):
            raise RequestRejected(
                f"resume point claims {point.frames_sent} frames heard; "
                f"its rows spell {self.layout.frames_ready(seq)}"
            )
        seq.audio.frames_sent = point.frames_sent
        seq.audio.rows_sent = len(point.rows)
        seq.audio.playout.first_frame = point.frames_sent

    def _resume_from_start(self, seq: Sequence, point: ResumePoint) -> None:
        """A restarting layout's stream resumes by being made again from its start (the same
        draws: its seed, or its request id's): its heard frames are replayed into the codec
        unheard as they come, and its listener gets what follows them."""
        if point.rows:
            raise RequestRejected("this model's streams resume from their frames heard, not rows")
        if not 0 <= point.frames_sent <= seq.target_frames:
            raise RequestRejected(
                f"resume point claims {point.frames_sent} frames heard; the stream makes at "
                f"most {seq.target_frames}"
            )
        assert seq.audio is not None
        seq.audio.frames_sent = point.frames_sent
        seq.audio.playout.first_frame = point.frames_sent

    @staticmethod
    def _prompt(build: Callable[[], list[list[int]]]) -> list[list[int]]:
        try:
            return build()
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc

    def _context(self, request: SynthesisRequest) -> list[PromptTurn]:
        """The conversation turns as codec frames (audio encoded); refused when the model
        takes no context or a turn is not this model's."""
        if not self.model.takes_context:
            raise RequestRejected("this model takes no conversation context")
        assert self.codec is not None
        turns: list[PromptTurn] = []
        width, size = self.codec.num_codebooks, self.codec.codebook_size
        for index, turn in enumerate(request.context):
            where = f"context turn {index}"
            if turn.voice not in self.model.voices:
                raise RequestRejected(
                    f"{where}: unknown voice {turn.voice!r}; voices: {', '.join(self.model.voices)}"
                )
            if turn.audio is not None and turn.codes:
                raise RequestRejected(f"{where}: give its audio or its codes, not both")
            if len(turn.text) > self.limits.max_input_chars:
                raise RequestRejected(
                    f"{where}: text is {len(turn.text)} characters; the limit is "
                    f"{self.limits.max_input_chars}"
                )
            frames = [list(frame) for frame in turn.codes]
            if any(len(f) != width or not all(0 <= c < size for c in f) for f in frames):
                raise RequestRejected(
                    f"{where}: codes must be frames of {width} ids in [0, {size})"
                )
            if turn.audio is not None:
                if request.prompt_sample_rate != self.codec.sample_rate:
                    raise RequestRejected(
                        f"{where}: audio must be at the codec's {self.codec.sample_rate} Hz"
                    )
                frames = self._encode_context(turn.audio, where)
            turns.append((turn.voice, turn.text, frames))
        return turns

    def _encode_context(self, audio: bytes, where: str) -> list[list[int]]:
        """:meth:`_encode`, remembered: a conversation sends its user turns again with every
        new turn, and each is encoded once."""
        key = hashlib.blake2b(audio, digest_size=16).digest()
        frames = self._encoded.get(key)
        if frames is None:
            frames = self._encode(audio, where)
            self._encoded[key] = frames
            while len(self._encoded) > ENCODED_TURNS_KEPT:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(key)
        return frames

    def _encode(self, audio_bytes: bytes, what: str) -> list[list[int]]:
        """float32 samples at the codec's rate -> codec frames; refused if too long or not
        audio."""
        assert self.codec is not None
        if len(audio_bytes) % 4 or not audio_bytes:
            raise RequestRejected(f"{what}: audio must be float32 samples")
        audio = np.frombuffer(audio_bytes, dtype="<f4")
        seconds = audio.size / self.codec.sample_rate
        if seconds > self.limits.max_prompt_audio_s:
            raise RequestRejected(
                f"{what} is {seconds:.1f} s of audio; the limit is "
                f"{self.limits.max_prompt_audio_s} s"
            )
        if not np.isfinite(audio).all():
            raise RequestRejected(f"{what}: audio holds NaN or infinite samples")
        try:
            codes = self.codec.encode_audio(audio.copy())
        except CodecError as exc:
            raise RequestRejected(f"{what}: {exc}") from exc
        return [list(map(int, frame)) for frame in codes.T.tolist()]

    def _prompt_codes(self, request: SynthesisRequest) -> list[list[int]] | None:
        """The speech prompt as codec frames; refused if too long or not audio."""
        if not request.prompt_audio:
            return None
        assert self.codec is not None
        if len(request.prompt_audio) % 4:
            raise RequestRejected("prompt_audio must be float32 samples")
        if request.prompt_sample_rate != self.codec.sample_rate:
            raise RequestRejected(
                f"prompt audio must be at the codec's {self.codec.sample_rate} Hz, "
                f"not {request.prompt_sample_rate} Hz"
            )
        return self._encode(request.prompt_audio, "speech prompt")

    def _sequence(
        self,
        request_id: str,
        prompt: list[list[int]],
        sampling: SamplingParams,
        max_new_steps: int,
        conditioning: str = "",
    ) -> Sequence:
        if not prompt:
            raise RequestRejected("empty prompt")
        if any(len(row) != self.layout.num_codebooks for row in prompt):
            raise RequestRejected("prompt rows do not match the model's codebooks")
        generator = torch.Generator(device=self.model.device)
        generator.manual_seed(self._seed(request_id, sampling))
        return Sequence(
            request_id=request_id,
            token_rows=prompt,
            sampling=sampling,
            generator=generator,
            max_new_steps=max_new_steps,
            extra_keys=(*self.extra_keys, conditioning),
        )

    def _seed(self, request_id: str, sampling: SamplingParams) -> int:
        """The request's seed; without one, a fresh random seed, or for a restarting layout's
        stream (which resumes by being made again) one drawn from its request id."""
        if sampling.seed is not None:
            return sampling.seed
        if isinstance(self.layout, ContextRestarts):
            digest = hashlib.sha256(request_id.encode()).digest()
            return int.from_bytes(digest[:8], "big") >> 1
        return secrets.randbits(63)
