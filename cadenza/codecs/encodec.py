"""EnCodec through ``transformers``: offline encode/decode of codec frames.

:func:`load_encodec` builds the 24 kHz model from a fixed seed (random weights; the library's
initialisation leaves codebooks at zero, so they are drawn from the seed too) or loads a local
Hugging Face EnCodec directory (weight norm under either of its names, see
:mod:`~cadenza.codecs.weight_norm`); :mod:`~cadenza.codecs.embedded_encodec` loads the one a
MusicGen checkpoint embeds. Weight normalisation is folded into plain weights at load.

A causal model (``use_causal_conv: true``, the 24 kHz one) decodes a prefix of a code sequence
to exactly the prefix of the full decode. A non-causal one (MusicGen's 32 kHz) does not: a
sample depends on the frames up to :attr:`EncodecCodec.lookahead_frames` after its own
(:mod:`~cadenza.codecs.encodec_noncausal`). Either way
:class:`~cadenza.codecs.encodec_streaming.EncodecStreamingDecoder` streams it exactly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import EncodecConfig, EncodecModel

from cadenza.codecs.codec import CodecError, check_frame_codes
from cadenza.codecs.encodec_noncausal import lookahead_samples
from cadenza.codecs.pretrained_codec import load_strictly
from cadenza.codecs.weight_norm import fold_weight_norm

if TYPE_CHECKING:
    from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder

ENCODEC_24KHZ = "encodec_24khz"
DEFAULT_BANDWIDTH_KBPS = 6.0  # 8 codebooks at 24 kHz (what Bark decodes)


class EncodecCodec:
    """One EnCodec model at a fixed bandwidth (which fixes the number of codebooks)."""

    def __init__(self, model: Any, bandwidth_kbps: float) -> None:
        config = model.config
        if bandwidth_kbps not in config.target_bandwidths:
            raise CodecError(f"bandwidth {bandwidth_kbps} kbps not in {config.target_bandwidths}")
        # transformers' type hints for EnCodec are narrower than its behaviour (decode takes
        # None scales, encode returns an output object): treat the model as untyped here.
        self.model: Any = model.eval()
        self.bandwidth_kbps = bandwidth_kbps
        self.sample_rate: int = config.sampling_rate
        self.hop_length: int = int(torch.tensor(config.upsampling_ratios).prod())
        self.frame_rate: float = self.sample_rate / self.hop_length
        bits_per_codebook = self.frame_rate * torch.tensor(config.codebook_size).log2().item()
        self.num_codebooks: int = round(bandwidth_kbps * 1000 / bits_per_codebook)
        self.codebook_size: int = config.codebook_size
        # frames after a frame that its last sample depends on (0: causal; MusicGen's 32 kHz: 4)
        self.lookahead_frames: int = math.ceil(lookahead_samples(model) / self.hop_length)
        self.streaming_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` int -> float32 audio ``[B, T * hop_length]`` in [-1, 1]-ish."""
        self.check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0)
        audio = self.model.decode(codes.to(self.device)[None], [None])[0]
        return audio[:, 0, : codes.shape[-1] * self.hop_length].float()

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """float audio ``[B, N]`` at ``sample_rate`` -> codes ``[B, K, ceil(N / hop_length)]``."""
        if audio.dim() != 2:
            raise CodecError(f"audio must be [batch, samples], got shape {tuple(audio.shape)}")
        encoded = self.model.encode(audio[:, None].to(self.device), bandwidth=self.bandwidth_kbps)
        return encoded.audio_codes[0]

    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """A speech prompt (float32 mono at :attr:`sample_rate`) -> codes ``[K, frames]``.

        Turn-based: a speech prompt is used only once it is complete, so encoding it
        incrementally would save nothing, and the offline encoder is the exact reference.
        """
        if audio.ndim != 1 or not audio.size:
            raise CodecError("prompt audio must be a non-empty mono array")
        samples = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        return self.encode(samples[None])[0]

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> EncodecStreamingDecoder:
        from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder

        return EncodecStreamingDecoder(self, max_streams, compute_dtype)

    def check_codes(self, codes: torch.Tensor) -> None:
        check_frame_codes(codes, self.num_codebooks, self.codebook_size)


def load_encodec(
    name_or_path: str = ENCODEC_24KHZ,
    device: str | torch.device = "cpu",
    seed: int = 0,
    bandwidth_kbps: float | None = None,
) -> EncodecCodec:
    """``"encodec_24khz"`` (random, from ``seed``) or a local Hugging Face EnCodec directory,
    at ``bandwidth_kbps`` (``None``: :func:`default_bandwidth` of its config)."""
    model: Any
    if name_or_path == ENCODEC_24KHZ:
        model = build_random_encodec(seed)
    elif Path(name_or_path).is_dir():
        model = _load_directory(Path(name_or_path))
    else:
        raise CodecError(f"unknown codec {name_or_path!r}: not {ENCODEC_24KHZ!r} nor a directory")
    fold_weight_norm(model)
    model.to(torch.device(device))
    if bandwidth_kbps is None:
        bandwidth_kbps = default_bandwidth(model.config)
    return EncodecCodec(model, bandwidth_kbps)


def default_bandwidth(config: EncodecConfig) -> float:
    """The bandwidth an EnCodec config is decoded at unless told: its only one when it has one
    (facebook/encodec_32khz: 2.2 kbps, 4 codebooks), else :data:`DEFAULT_BANDWIDTH_KBPS` (the
    24 and 48 kHz models offer it). Raises :class:`CodecError` when neither applies."""
    bandwidths = list(config.target_bandwidths)
    if len(bandwidths) == 1:
        return float(bandwidths[0])
    if DEFAULT_BANDWIDTH_KBPS in bandwidths:
        return DEFAULT_BANDWIDTH_KBPS
    raise CodecError(f"no default among the bandwidths {bandwidths} kbps: name one")


def bandwidth_for_codebooks(config: EncodecConfig, num_codebooks: int) -> float:
    """The config's target bandwidth that gives ``num_codebooks`` codebooks (``K * frame rate
    * log2(codebook size)`` bits a second). Raises :class:`CodecError` when it offers none."""
    frame_rate = config.sampling_rate / math.prod(config.upsampling_ratios)
    wanted = num_codebooks * frame_rate * math.log2(config.codebook_size) / 1000
    for bandwidth in config.target_bandwidths:
        if math.isclose(bandwidth, wanted, rel_tol=1e-6):
            return float(bandwidth)
    raise CodecError(
        f"{num_codebooks} codebooks ({wanted:g} kbps) is none of the EnCodec's bandwidths "
        f"{list(config.target_bandwidths)} kbps"
    )


def _load_directory(directory: Path) -> Any:
    """``transformers``' loader, which maps weight norm's legacy names (``weight_g`` /
    ``weight_v``, as facebook/encodec_24khz publishes them) to the parametrisation's itself;
    weights left missing (which it would draw at random) are refused."""
    return load_strictly(EncodecModel, directory, "EnCodec")


def build_random_encodec(seed: int) -> Any:
    """The 24 kHz EnCodec as ``transformers`` builds it (weight-normalised), random weights and
    codebooks drawn from ``seed``: the same model on every machine."""
    generator = torch.Generator().manual_seed(seed)
    model: Any
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = EncodecModel(EncodecConfig())
    with torch.no_grad():
        for name, buffer in model.quantizer.named_buffers():
            if name.endswith("codebook.embed"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
    model.eval()
    return model
