"""What Bark's stages read, as pure functions of a stream's tokens so far: the semantic prompt,
each coarse window's prompt and the fine stage's windows. Each follows ``transformers``'
``BarkModel.generate`` for one stream exactly, quirks included (they are what the published
weights were run with): the coarse history drops its last two tokens, every coarse window is a
fresh prompt with positions from 0, and a fine window re-predicts the overlap with the window
before from inputs that window already filled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cadenza.engine.models.bark.bark_constants import BarkConstants
from cadenza.engine.models.bark.bark_voices import VoicePreset


def semantic_prompt(
    text_ids: list[int], voice: VoicePreset | None, constants: BarkConstants
) -> tuple[torch.Tensor, torch.Tensor]:
    """The semantic stage's prompt as two rows of ``max_input_semantic_length`` ids whose
    embeddings are summed (the text shifted by the text offset and padded; the voice's semantic
    history, padded), to which the infer token is appended as one more position."""
    length = constants.max_input_semantic_length
    text = [token + constants.text_encoding_offset for token in text_ids[:length]]
    text += [constants.text_pad_token] * (length - len(text))
    history = voice.semantic[-length:].tolist() if voice is not None else []
    history += [constants.semantic_pad_token] * (length - len(history))
    return torch.tensor(text), torch.tensor(history)


@dataclass(frozen=True)
class CoarseHistory:
    """A voice's histories as the coarse stage reads them: semantic tokens, and the coarse
    tokens flattened (frame by frame, the second codebook shifted by the codebook size, both
    past the semantic ids)."""

    semantic: list[int]
    coarse: list[int]


def coarse_history(voice: VoicePreset | None, constants: BarkConstants) -> CoarseHistory:
    if voice is None:
        return CoarseHistory([], [])
    ratio = constants.semantic_to_coarse_ratio
    offsets = torch.arange(constants.n_coarse_codebooks)[:, None] * constants.codebook_size
    flat = (voice.coarse + offsets).T.reshape(-1) + constants.semantic_vocab_size
    semantic_len = int(voice.semantic.shape[0])
    provided = min(
        constants.max_semantic_history,
        semantic_len - semantic_len % 2,
        math.floor(flat.shape[0] / ratio),
    )
    coarse_len = round(provided * ratio)
    # Python's slicing, as transformers slices: a zero count takes the whole history.
    semantic = voice.semantic[-provided:].tolist()
    coarse = flat[-coarse_len:].tolist()
    return CoarseHistory(semantic, coarse[:-2])


def coarse_tokens_for(semantic_tokens: int, constants: BarkConstants) -> int:
    """Coarse tokens (frames times codebooks) the coarse stage makes from ``semantic_tokens``,
    rounded as ``transformers`` rounds them (in float32)."""
    per = constants.n_coarse_codebooks
    frames = torch.floor(torch.tensor([semantic_tokens]) * constants.semantic_to_coarse_ratio / per)
    return int(torch.round(frames * per).int().item())


def coarse_window_prompt(
    semantic: list[int],
    history_len: int,
    coarse: list[int],
    generated: int,
    constants: BarkConstants,
) -> list[int]:
    """The prompt of the coarse window that starts after ``generated`` coarse tokens:
    semantic tokens around the window (``semantic`` holds the voice's ``history_len`` first)
    padded to ``max_coarse_input_length``, the infer token, the last ``max_coarse_history``
    coarse tokens (``coarse``: history and generated)."""
    index = history_len + round(generated / constants.semantic_to_coarse_ratio)
    start = max(0, index - constants.max_semantic_history)
    window = semantic[start:][: constants.max_coarse_input_length]
    window += [constants.coarse_semantic_pad_token] * (
        constants.max_coarse_input_length - len(window)
    )
    return [*window, constants.coarse_infer_token, *coarse[-constants.max_coarse_history :]]


def coarse_allowed(step: int, constants: BarkConstants, vocab: int) -> tuple[int, int]:
    """The ids a window's ``step``-th token may take, ``[low, high)``: the first codebook's on
    even steps, everything past it on odd ones (as ``transformers`` masks them)."""
    low = constants.semantic_vocab_size
    if step % 2 == 0:
        return low, low + constants.codebook_size
    return low + constants.codebook_size, vocab


def coarse_codes(coarse: list[int], constants: BarkConstants) -> torch.Tensor:
    """Generated coarse tokens -> codebook ids ``[frames, n_coarse_codebooks]``."""
    tokens = torch.tensor(coarse, dtype=torch.int64).view(-1, constants.n_coarse_codebooks)
    return torch.remainder(tokens - constants.semantic_vocab_size, constants.codebook_size)


@dataclass
class FineWindows:
    """The fine stage's input for one stream and the windows it runs over it. ``buffer [L, 8]``
    holds the voice's fine history, then the stream's ``frames`` frames (the coarse codes as
    they arrive, the other codebooks unset: ``codebook_size``), then padding up to one window;
    :attr:`windows` lists each window's ``(start, fill_start)`` in buffer rows. The windows
    follow from ``frames`` alone, so they are laid out as soon as the coarse stage knows how
    many frames it will make, and a window can run once the coarse codes reach its end."""

    buffer: torch.Tensor
    history: int
    frames: int
    windows: list[tuple[int, int]]
    coarse_frames: int = 0  # coarse frames put so far

    def put_coarse(self, codes: torch.Tensor) -> None:
        """Append coarse codes ``[n, n_coarse_codebooks]``."""
        row = self.history + self.coarse_frames
        if self.coarse_frames + codes.shape[0] > self.frames:
            raise ValueError("more coarse frames than laid out")
        self.buffer[row : row + codes.shape[0], : codes.shape[1]] = codes
        self.coarse_frames += codes.shape[0]

    def ready(self, window: int, width: int) -> bool:
        """Whether the coarse codes reach the end of ``window`` (``width`` rows)."""
        start, _ = self.windows[window]
        return self.coarse_frames >= min(self.frames, start + width - self.history)

    def final_after(self, window: int) -> int:
        """Frames (from the stream's first) whose codes no window after ``window`` changes."""
        if window + 1 < len(self.windows):
            return self.windows[window + 1][1] - self.history
        return self.frames

    @property
    def codes(self) -> torch.Tensor:
        """The filled-in codes ``[8, frames]`` (after every window has run)."""
        return self.buffer[self.history : self.history + self.frames].T.contiguous()


def fine_windows(frames: int, voice: VoicePreset | None, constants: BarkConstants) -> FineWindows:
    """The fine windows over a stream of ``frames`` frames, no coarse codes put yet."""
    unset = constants.codebook_size
    width = constants.max_fine_input_length
    step = constants.max_fine_history_length
    parts = [torch.full((frames, constants.n_fine_codebooks), unset, dtype=torch.int64)]
    history = 0
    if voice is not None:
        past = voice.fine.T[-step:]
        history = past.shape[0]
        parts.insert(0, past)
    buffer = torch.cat(parts)
    if buffer.shape[0] < width:
        padding = torch.full((width - buffer.shape[0], constants.n_fine_codebooks), unset)
        buffer = torch.cat([buffer, padding])
    loops = max(0, math.ceil((frames - (width - history)) / step)) + 1
    total = buffer.shape[0]
    windows = [
        (min(n * step, total - width), min(history + n * step, total - step)) for n in range(loops)
    ]
    return FineWindows(buffer.clone(), history, frames, windows)
