"""The audio stage: a step's sampled rows become stream outputs.

Every audio stream holds a slot in the codec's streaming decoder from admission to its end.
After each step, the streams whose chunk is due (:mod:`~cadenza.engine.chunk_policy`) are
decoded in **one batched call**; each chunk's slack against the stream's playout clock and the
codec's time go to the step telemetry. Streams that finished get their last audio (the decoder
flushes and frees their slots); streams that failed or were cancelled free their slots unheard.
Every output carries the rows generated since the stream's previous one (what the edge keeps to
resume the stream on another engine). A resumed stream's slot is first fed the frames its
listener already heard (the last ``replay_frames`` of them), unheard, so that its next audio
continues the same waveform; a stream of a restarting layout (Bark's), which makes those frames
again rather than resuming from rows, is fed them as soon as they are made.

:class:`TokenOutputs` is the stage of a model without audio (a text LM): it only reports
endings.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np
import torch

from cadenza.codecs.codec import AudioCodec
from cadenza.contract.request import FinishReason, StreamOutput
from cadenza.engine.chunk_policy import streams_to_decode
from cadenza.engine.layouts.token_layout import ContextRestarts, TokenLayout
from cadenza.engine.realtime.step_telemetry import StepTelemetry
from cadenza.engine.scheduler import StepOutcome
from cadenza.engine.sequence import Sequence

EMPTY_AUDIO = np.zeros(0, dtype=np.float32)


def _new_rows(seq: Sequence, restarts: bool) -> np.ndarray | None:
    """The rows ``seq`` generated since its previous output (``None``: none, a raw token
    request, which is not resumed, or a restarting layout's stream, which resumes by making
    its audio again: its rows are its current context's only)."""
    if seq.audio is None or restarts:
        return None
    start, end = seq.audio.rows_sent, seq.num_generated
    if end <= start:
        return None
    seq.audio.rows_sent = end
    return np.asarray(seq.token_rows[seq.num_prompt_tokens + start :], dtype=np.int32)


def ending(
    seq: Sequence,
    reason: FinishReason,
    audio: np.ndarray = EMPTY_AUDIO,
    codes: np.ndarray | None = None,
) -> StreamOutput:
    """A stream's last output (failures carry ``error_code = "internal"``)."""
    failed = reason is FinishReason.ERROR
    return StreamOutput(
        seq.request_id,
        audio,
        reason,
        error=seq.error if failed else None,
        codes=codes,
        error_code="internal" if failed else None,
    )


class TokenOutputs:
    """The output stage of a model that produces no audio: endings only."""

    def open(self, seq: Sequence) -> None:
        """Nothing to hold for a token stream."""

    def release(self, seq: Sequence) -> None:
        """Nothing to free for a token stream."""

    def emit(self, outcome: StepOutcome) -> list[StreamOutput]:
        outputs = [ending(seq, FinishReason.ERROR) for seq in outcome.failed]
        return outputs + [ending(seq, reason) for seq, reason in outcome.finished.items()]


class AudioStage(TokenOutputs):
    def __init__(
        self,
        codec: AudioCodec,
        layout: TokenLayout,
        *,
        max_streams: int,
        first_chunk_frames: int,
        chunk_frames: int,
        compute_dtype: torch.dtype = torch.float32,
        replay_frames: int = 750,
        telemetry: StepTelemetry,
        clock: Callable[[], float] = time.monotonic,
        device: torch.device | None = None,
    ) -> None:
        if codec.num_codebooks != layout.codebooks_per_frame:
            raise ValueError(
                f"the model's frames have {layout.codebooks_per_frame} codebooks; "
                f"the codec has {codec.num_codebooks}"
            )
        self.codec = codec
        # On CUDA the codec works on a stream of its own: its chunks decode, and their audio
        # comes back to the host, while the model's next step runs (engine.overlap_steps). Its
        # decoder's state is made there too, so every block the decoder frees was its own.
        self._stream = None
        if device is not None and device.type == "cuda":
            self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self._stream.wait_stream(torch.cuda.current_stream(device))  # the codec's weights
        with self._on_codec_stream():
            self.decoder = codec.streaming_decoder(max_streams, compute_dtype)
        self.layout = layout
        self.first_chunk_frames = first_chunk_frames
        self.chunk_frames = chunk_frames
        self.replay_frames = replay_frames
        self.restarts = isinstance(layout, ContextRestarts)
        self.telemetry = telemetry
        self.clock = clock

    def _on_codec_stream(self) -> contextlib.AbstractContextManager[object]:
        """Where every decoder call runs: the codec's own CUDA stream, else as it is."""
        if self._stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._stream)

    def open(self, seq: Sequence) -> None:
        """Give ``seq`` its decoder slot (a resumed stream's rebuilt from the frames already
        heard). Raises ``CodecError`` when none is free or the frames are not codes."""
        assert seq.audio is not None, "an audio stream needs its playout clock"
        with self._on_codec_stream():
            slot = self.decoder.open()
        seq.audio.codec_slot = slot
        heard = seq.audio.frames_sent
        if heard > 0 and self.replay_frames > 0:
            if self.layout.frames_ready(seq) < heard:
                seq.audio.replay_pending = True  # replayed once made again (_decode)
                return
            try:
                self._replay(seq)
            except Exception:
                with self._on_codec_stream():
                    self.decoder.release(slot)
                seq.audio.codec_slot = None
                raise

    def _replay(self, seq: Sequence) -> None:
        """Feed ``seq``'s slot the last ``replay_frames`` frames its listener heard, unheard."""
        assert seq.audio is not None and seq.audio.codec_slot is not None
        heard = seq.audio.frames_sent
        codes = self.layout.frame_codes(seq, max(heard - self.replay_frames, 0), heard)
        chunk = torch.tensor(codes, dtype=torch.long).reshape(-1, self.codec.num_codebooks).T
        with self._on_codec_stream():
            self.decoder.decode({seq.audio.codec_slot: chunk})
        seq.audio.replay_pending = False

    def release(self, seq: Sequence) -> None:
        """Free ``seq``'s slot without decoding what it holds (cancelled or failed)."""
        if seq.audio is not None and seq.audio.codec_slot is not None:
            with self._on_codec_stream():
                self.decoder.release(seq.audio.codec_slot)
            seq.audio.codec_slot = None

    def emit(self, outcome: StepOutcome) -> list[StreamOutput]:
        for seq in outcome.failed:
            self.release(seq)
        outputs = [ending(seq, FinishReason.ERROR) for seq in outcome.failed]
        decoded = self._decode(outcome.sampled, outcome.finished)
        for seq in outcome.sampled:
            audio, codes = decoded.get(seq, (EMPTY_AUDIO, None))
            if seq in outcome.finished:
                self.release(seq)  # a stream with nothing left to flush
                output = ending(seq, outcome.finished[seq], audio, codes)
            elif seq in decoded:
                output = StreamOutput(seq.request_id, audio, codes=codes)
            else:
                continue
            output.rows = _new_rows(seq, self.restarts)
            outputs.append(output)
        return outputs

    def _decode(
        self, sampled: list[Sequence], finished: dict[Sequence, FinishReason]
    ) -> dict[Sequence, tuple[np.ndarray, np.ndarray]]:
        """Decode, in one batched call, every stream whose chunk is due."""
        pending = {
            seq: self.layout.frames_ready(seq) - seq.frames_sent
            for seq in sampled
            if seq.audio is not None and seq.audio.codec_slot is not None
        }
        chosen = streams_to_decode(
            pending,
            finished,
            first_chunk_frames=self.first_chunk_frames,
            chunk_frames=self.chunk_frames,
        )
        if not chosen:
            return {}
        chunks: dict[int, torch.Tensor] = {}
        owners: dict[int, Sequence] = {}
        first_frames: dict[int, int] = {}
        for seq in chosen:
            assert seq.audio is not None and seq.audio.codec_slot is not None
            if seq.audio.replay_pending:
                self._replay(seq)
            start, end = seq.audio.frames_sent, seq.audio.frames_sent + pending[seq]
            codes = self.layout.frame_codes(seq, start, end)
            slot = seq.audio.codec_slot
            chunks[slot] = (
                torch.tensor(codes, dtype=torch.long).reshape(-1, self.layout.codebooks_per_frame).T
            )
            owners[slot], first_frames[slot] = seq, start
            seq.audio.frames_sent = end
        final = frozenset(slot for slot, seq in owners.items() if seq in finished)
        started = time.perf_counter()
        with self._on_codec_stream():
            decoded = self.decoder.decode(chunks, final)
            audio = {slot: pcm.clamp(-1.0, 1.0).numpy() for slot, pcm in decoded.items()}
        now = self.clock()
        self.telemetry.record_codec(
            time.perf_counter() - started, sum(int(c.shape[1]) for c in chunks.values())
        )
        for slot, seq in owners.items():
            assert seq.audio is not None
            # A chunk is delivered when the listener gets sound from it: a first chunk shorter
            # than the codec's context decodes to nothing yet and must not start the clock.
            if audio[slot].size > 0:
                self.telemetry.record_chunk(seq.audio.playout.delivered(first_frames[slot], now))
            if slot in final:
                seq.audio.codec_slot = None  # the decoder closed it after the flush
        return {
            owners[slot]: (pcm, chunks[slot].T.numpy().astype(np.uint16))
            for slot, pcm in audio.items()
        }
