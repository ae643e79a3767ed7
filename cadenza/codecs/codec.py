"""What the engine needs from a neural audio codec, whatever its family.

A codec turns frames of codes (``num_codebooks`` per frame, ``frame_rate`` frames a second)
into audio at ``sample_rate``, offline (:meth:`AudioCodec.decode`) and, for serving, through a
:class:`StreamingDecoder` whose output for any chunking equals the offline decode. It also
encodes audio at its own rate into codes (speech prompts).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class CodecError(ValueError):
    """Codes or audio the codec cannot take (wrong shape, out-of-range ids), or no free
    streaming slot."""


class StreamingDecoder(Protocol):
    """Per-slot streaming decode, batched across slots (one slot per stream)."""

    def open(self) -> int:
        """Start a stream in a free slot and return the slot. Raises :class:`CodecError`
        when every slot is taken."""
        ...

    def decode(
        self, chunks: dict[int, torch.Tensor], final: frozenset[int] = frozenset()
    ) -> dict[int, torch.Tensor]:
        """New codes ``{slot: [K, n]}`` (host tensors) -> new audio ``{slot: float32 [m]}`` on
        the host, in one batched pass read back once; slots in ``final`` end with this chunk
        (flushed, then freed)."""
        ...

    def release(self, slot: int) -> None:
        """Free ``slot`` without flushing it (a cancelled stream)."""
        ...


class AudioCodec(Protocol):
    sample_rate: int
    frame_rate: float
    num_codebooks: int
    codebook_size: int
    lookahead_frames: int  # frames after a frame its streamed audio waits for (0: causal)
    streaming_dtypes: tuple[torch.dtype, ...]  # what its streaming decoder can compute in

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> float32 audio ``[B, samples]`` (offline, the reference)."""
        ...

    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """float32 mono audio at :attr:`sample_rate` -> codes ``[K, frames]``."""
        ...

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> StreamingDecoder:
        """A decoder of up to ``max_streams`` streams computing in ``compute_dtype`` (one of
        :attr:`streaming_dtypes`; its output is float32 whatever it computes in)."""
        ...


def check_frame_codes(codes: torch.Tensor, num_codebooks: int, codebook_size: int) -> None:
    """Raise :class:`CodecError` unless ``codes`` is an integer ``[batch, num_codebooks,
    frames]`` tensor of ids in ``[0, codebook_size)``."""
    if codes.dim() != 3 or codes.shape[1] != num_codebooks:
        raise CodecError(
            f"codes must be [batch, {num_codebooks}, frames], got {tuple(codes.shape)}"
        )
    if codes.dtype not in (torch.int32, torch.int64):
        raise CodecError(f"codes must be integers, got {codes.dtype}")
    if codes.numel() and (codes.min() < 0 or codes.max() >= codebook_size):
        raise CodecError(f"codes must lie in [0, {codebook_size})")
