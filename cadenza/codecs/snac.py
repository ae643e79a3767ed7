"""SNAC (multi-scale neural audio codec): offline decoding of codec frames.

:func:`load_snac` builds the 24 kHz model from a fixed seed (random weights) or loads a
directory in the public layout (``config.json`` + ``pytorch_model.bin``, weight-norm keys old
style ``weight_g``/``weight_v`` or new style ``parametrizations.weight.original0/1``). Weight
normalisation is folded into plain weights at load.

SNAC quantises at several rates: level ``i`` has one code every ``vq_strides[i]`` latent steps.
A codec *frame* here is one step of the coarsest level and every code that falls inside it,
in level order: for the 24 kHz model (strides 4, 2, 1) that is 7 codes, ``L0[i], L1[2i],
L1[2i+1], L2[4i] .. L2[4i+3]``, and 2048 samples (85.3 ms at 24 kHz).

The decoder is not causal: its convolutions are centred and zero-padded, so a code reaches
about 4,760 samples each way (24 kHz model). ``NoiseBlock`` layers add fresh Gaussian noise on
every call; ``noise=False`` leaves them out (reproducible output, as for tests).
:class:`~cadenza.codecs.snac_streaming.SnacStreamingDecoder` streams the same decode exactly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from cadenza.codecs.codec import CodecError, check_frame_codes
from cadenza.codecs.weight_norm import fold_weight_norm, parametrized_weight_norm_names

if TYPE_CHECKING:
    from cadenza.codecs.snac_streaming import SnacStreamingDecoder

SNAC_24KHZ = "snac_24khz"


class SnacConfig(BaseModel):
    """``config.json`` of a SNAC checkpoint (the ``snac`` package's constructor arguments)."""

    model_config = ConfigDict(extra="forbid")

    sampling_rate: int = Field(gt=0)
    encoder_dim: int = Field(gt=0)
    encoder_rates: list[int]
    latent_dim: int | None = None
    decoder_dim: int = Field(gt=0)
    decoder_rates: list[int]
    attn_window_size: int | None = None
    codebook_size: int = Field(ge=2)
    codebook_dim: int = Field(gt=0)
    vq_strides: list[int]
    noise: bool = True
    depthwise: bool = True

    @property
    def latent_channels(self) -> int:
        return self.latent_dim or self.encoder_dim * 2 ** len(self.encoder_rates)


SNAC_24KHZ_CONFIG = SnacConfig(
    sampling_rate=24000,
    encoder_dim=48,
    encoder_rates=[2, 4, 8, 8],
    decoder_dim=1024,
    decoder_rates=[8, 8, 4, 2],
    attn_window_size=None,
    codebook_size=4096,
    codebook_dim=8,
    vq_strides=[4, 2, 1],
    noise=True,
    depthwise=True,
)


# -- the decoder's layers (parameter names match the public checkpoints) ----------------------


def _conv(*args: Any, **kwargs: Any) -> nn.Conv1d:
    return weight_norm(nn.Conv1d(*args, **kwargs))


class Snake(nn.Module):
    """``x + sin(alpha * x)^2 / alpha``, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``x + sin(alpha * x)^2 / alpha``, the reference's operations in its order (bit-identical),
    on one temporary worked in place: on a decoder's large activations that is ~3x faster than a
    fresh tensor per operation. Inference only (autograd cannot differentiate it)."""
    return (alpha * x).sin_().square_().mul_((alpha + 1e-9).reciprocal()).add_(x)


class NoiseBlock(nn.Module):
    """``x + noise * linear(x)`` with one standard normal draw per time step."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear = _conv(channels, channels, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape[0], 1, x.shape[-1], device=x.device, dtype=x.dtype)
        return x + noise * self.linear(x)


class ResidualUnit(nn.Module):
    """Snake, a centred dilated conv (kernel 7), Snake, a 1x1 conv; plus the input."""

    def __init__(self, channels: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels),
            _conv(
                channels,
                channels,
                kernel_size=7,
                dilation=dilation,
                padding=3 * dilation,
                groups=groups,
            ),
            Snake(channels),
            _conv(channels, channels, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class DecoderBlock(nn.Module):
    """Snake, a transposed conv that upsamples by ``stride``, optional noise, three residual
    units (dilations 1, 3, 9)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, noise: bool, groups: int):
        super().__init__()
        layers: list[nn.Module] = [
            Snake(in_channels),
            weight_norm(
                nn.ConvTranspose1d(
                    in_channels,
                    out_channels,
                    kernel_size=2 * stride,
                    stride=stride,
                    padding=math.ceil(stride / 2),
                    output_padding=stride % 2,
                )
            ),
        ]
        if noise:
            layers.append(NoiseBlock(out_channels))
        layers += [ResidualUnit(out_channels, dilation, groups) for dilation in (1, 3, 9)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class SnacDecoder(nn.Module):
    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        latent, channels = config.latent_channels, config.decoder_dim
        layers: list[nn.Module]
        if config.depthwise:
            layers = [
                _conv(latent, latent, kernel_size=7, padding=3, groups=latent),
                _conv(latent, channels, kernel_size=1),
            ]
        else:
            layers = [_conv(latent, channels, kernel_size=7, padding=3)]
        out_channels = channels
        for index, stride in enumerate(config.decoder_rates):
            in_channels, out_channels = channels // 2**index, channels // 2 ** (index + 1)
            groups = out_channels if config.depthwise else 1
            layers.append(DecoderBlock(in_channels, out_channels, stride, config.noise, groups))
        layers += [Snake(out_channels), _conv(out_channels, 1, kernel_size=7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.model(latent)


class CodeEmbedding(nn.Module):
    """One quantiser level's decoding half: codebook lookup and projection to the latent."""

    def __init__(self, latent: int, codebook_size: int, codebook_dim: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(codebook_size, codebook_dim)
        self.out_proj = _conv(codebook_dim, latent, kernel_size=1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, n]`` -> latent ``[B, C, n * stride]``."""
        projected = self.out_proj(self.codebook(codes).transpose(1, 2))
        return projected.repeat_interleave(self.stride, dim=-1)


class CodeLatent(nn.Module):
    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(
            CodeEmbedding(config.latent_channels, config.codebook_size, config.codebook_dim, s)
            for s in config.vq_strides
        )


class SnacModel(nn.Module):
    """SNAC's decoding half; parameter names as in the public checkpoints (whose encoder and
    quantiser input projections are not loaded)."""

    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        if config.attn_window_size is not None:
            raise CodecError(
                "SNAC models with local attention (attn_window_size set: the 32 and 44 kHz "
                "models) are not supported; the 24 kHz speech model has none"
            )
        if any(config.vq_strides[0] % stride for stride in config.vq_strides):
            raise CodecError(f"vq_strides {config.vq_strides} must divide the first one")
        self.config = config
        self.quantizer = CodeLatent(config)
        self.decoder = SnacDecoder(config)

    def latent(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """Codes per level (``[B, n_i]``) -> the decoder's input ``[B, C, steps]``."""
        out = self.quantizer.quantizers[0](levels[0])
        for quantizer, codes in zip(self.quantizer.quantizers[1:], levels[1:], strict=True):
            out = out + quantizer(codes)
        return out


# -- the codec ------------------------------------------------------------------------------


class SnacCodec:
    """SNAC through frames of ``num_codebooks`` codes (see the module docstring)."""

    def __init__(self, model: SnacModel, noise: bool = True) -> None:
        config = model.config
        self.model = model.eval()
        self.noise = noise
        self.sample_rate = config.sampling_rate
        self.latent_steps_per_frame = config.vq_strides[0]
        self.level_codes = [config.vq_strides[0] // stride for stride in config.vq_strides]
        self.hop_length = self.latent_steps_per_frame * math.prod(config.decoder_rates)
        self.frame_rate = self.sample_rate / self.hop_length
        self.num_codebooks = sum(self.level_codes)
        self.codebook_size = config.codebook_size
        self.noise_blocks = [m for m in model.modules() if isinstance(m, NoiseBlock)]
        self.streaming_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
        lookahead = self.streaming_decoder(max_streams=1).lookahead_samples
        self.lookahead_frames = math.ceil(lookahead / self.hop_length)  # 24 kHz: 3

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def levels(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """Frames ``[B, K, T]`` -> codes per level, ``[B, T * codes_in_frame]`` each."""
        out, first = [], 0
        for count in self.level_codes:
            level = codes[:, first : first + count, :]  # [B, count, T]
            out.append(level.transpose(1, 2).reshape(codes.shape[0], -1))
            first += count
        return out

    def frames(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`levels`."""
        batch, frames = levels[0].shape
        pieces = [
            level.reshape(batch, frames, count).transpose(1, 2)
            for level, count in zip(levels, self.level_codes, strict=True)
        ]
        return torch.cat(pieces, dim=1)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> float32 audio ``[B, T * hop_length]``."""
        self.check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0)
        latent = self.model.latent(self.levels(codes.to(self.device).long()))
        x = latent
        for layer in self.model.decoder.model:
            x = _without_noise(layer, x) if not self.noise else layer(x)
        return x[:, 0].float()

    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        raise CodecError("SNAC speech prompts need the SNAC encoder, which is not loaded")

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> SnacStreamingDecoder:
        from cadenza.codecs.snac_streaming import SnacStreamingDecoder

        if compute_dtype not in self.streaming_dtypes:
            raise CodecError(f"SNAC streams in float32 only, not {compute_dtype}")
        return SnacStreamingDecoder(self, max_streams)

    def check_codes(self, codes: torch.Tensor) -> None:
        check_frame_codes(codes, self.num_codebooks, self.codebook_size)


def _without_noise(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(layer, DecoderBlock):
        for sub in layer.block:
            if not isinstance(sub, NoiseBlock):
                x = sub(x)
        return x
    return layer(x)


# -- loading --------------------------------------------------------------------------------


def load_snac(
    name_or_path: str = SNAC_24KHZ,
    device: str | torch.device = "cpu",
    seed: int = 0,
    noise: bool = True,
) -> SnacCodec:
    """``"snac_24khz"`` (random, from ``seed``) or a directory in the public layout."""
    if name_or_path == SNAC_24KHZ:
        model = build_random_snac(SNAC_24KHZ_CONFIG, seed)
    elif Path(name_or_path).is_dir():
        model = _load_directory(Path(name_or_path))
    else:
        raise CodecError(f"unknown codec {name_or_path!r}: not {SNAC_24KHZ!r} nor a directory")
    fold_weight_norm(model)
    model.to(torch.device(device))
    return SnacCodec(model, noise=noise)


def build_random_snac(config: SnacConfig, seed: int) -> SnacModel:
    """A SNAC model with weights drawn from ``seed``: the same model on every machine."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SnacModel(config).eval()


def is_snac_directory(path: Path) -> bool:
    """Whether ``path`` holds a SNAC checkpoint (its config has SNAC's keys)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {"vq_strides", "decoder_rates"} <= config.keys()


def _load_directory(directory: Path) -> SnacModel:
    try:
        config = SnacConfig.model_validate(json.loads((directory / "config.json").read_text()))
    except FileNotFoundError as exc:
        raise CodecError(f"{directory}: no config.json") from exc
    except (ValueError, ValidationError) as exc:
        raise CodecError(f"{directory}/config.json is not a SNAC config: {exc}") from exc
    model = SnacModel(config)
    weights = directory / "pytorch_model.bin"
    if not weights.exists():
        raise CodecError(f"{directory}: no pytorch_model.bin")
    state = torch.load(weights, map_location="cpu", weights_only=True)
    wanted = {
        key: tensor
        for key, tensor in state.items()
        if not key.startswith("encoder.") and ".in_proj." not in key
    }
    try:
        model.load_state_dict(parametrized_weight_norm_names(wanted), strict=True)
    except (RuntimeError, ValueError) as exc:
        raise CodecError(f"{directory}: weights do not fit the config: {exc}") from exc
    return model.eval()
