"""Chunked decoding for one stream by re-decoding a window of left context (a stub).

Each chunk of new frames is decoded together with up to ``context_frames`` frames before it,
and only the new frames' samples are kept. Because the codec is causal the result differs from
offline decoding only through the state (LSTM memory, convolution history) that lies beyond the
window, and the cost per chunk is bounded. It is an approximation and one stream per call: the
exact, batched streaming decoder with carried state replaces it.
"""

from __future__ import annotations

import torch

from cadenza.codecs.encodec import EncodecCodec


class WindowedChunkDecoder:
    def __init__(self, codec: EncodecCodec, context_frames: int = 25) -> None:
        self.codec = codec
        self.context_frames = context_frames
        self._history = torch.empty(codec.num_codebooks, 0, dtype=torch.long)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """New frames ``[K, n]`` -> their audio, float32 ``[n * hop_length]``."""
        num_new = codes.shape[-1]
        window = torch.cat([self._history, codes.to(self._history.device)], dim=-1)
        audio = self.codec.decode(window[None])[0]
        self._history = window[:, -self.context_frames :] if self.context_frames else window[:, :0]
        return audio[audio.shape[0] - num_new * self.codec.hop_length :]
