"""Mimi (Kyutai's 24 kHz causal codec, 12.5 frames a second) through ``transformers``.

:func:`load_mimi` loads a Hugging Face Mimi directory (``config.json`` with ``model_type:
"mimi"``) or the Mimi embedded in a model's checkpoint (a ``codec_config`` with ``model_type:
"mimi"``, the weights its ``codec_model.*`` tensors; a Sesame CSM checkpoint is one).
:func:`build_random_mimi` builds one from a config and a seed (tests).

A frame is ``num_codebooks`` codes: the semantic codebook(s) first, then the acoustic ones of
the split residual VQ. It decodes to ``hop_length = 1920`` samples (at 24 kHz): the codes'
latents are upsampled 2x (12.5 -> 25 Hz, a grouped transposed conv), go through a causal
sliding-window transformer and then the SEANet decoder (causal convs, zero left padding;
transposed convs whose overhang is trimmed on the right). ``decode`` of ``T`` frames gives
exactly ``T * 1920`` samples, and every layer is causal, so the decode of a prefix of a code
sequence is the prefix of the full decode (to float rounding): what lets
:class:`~cadenza.codecs.mimi_streaming.MimiStreamingDecoder` emit each frame's audio as soon
as the frame arrives, holding nothing back.

Encoding ``N`` samples gives ``ceil(N / 1920)`` frames; a partial last frame is encoded as the
model does it (each strided conv zero-pads its input up to a whole stride, the final 2x
downsampling replicates its last input).

Mimi has no weight normalisation in ``transformers``, nor in the published checkpoints, so no
legacy ``weight_g`` / ``weight_v`` names to map (any parametrisation found would be folded at
load); the model is kept in float32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import MimiConfig, MimiModel

from cadenza.codecs.codec import CodecError, check_frame_codes
from cadenza.codecs.prefixed_weights import read_prefixed_tensors
from cadenza.codecs.pretrained_codec import load_strictly
from cadenza.codecs.weight_norm import fold_weight_norm

if TYPE_CHECKING:
    from cadenza.codecs.mimi_streaming import MimiStreamingDecoder

EMBEDDED_CODEC_PREFIX = "codec_model."
"""Where a model's checkpoint keeps the weights of the codec its ``codec_config`` describes."""

# Checkpoints (Kyutai's Hugging Face port, and CSM's ``codec_model``) keep Mimi's original flat
# layout; ``MimiModel`` nests the halves. Flat prefix -> nested prefix.
_NESTED_PREFIXES = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."),
    ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."),
    ("upsample.", "decoder.upsample."),
    ("decoder_transformer.", "decoder.decoder_transformer."),
    ("decoder.layers.", "decoder.decoder_seanet.layers."),
)


class MimiCodec:
    """One Mimi model decoding (and encoding) frames of its first ``num_codebooks`` codebooks."""

    def __init__(self, model: MimiModel, num_codebooks: int | None = None) -> None:
        config = model.config
        if config.audio_channels != 1:
            raise CodecError(f"Mimi with {config.audio_channels} audio channels: mono only")
        if model.decoder is None:
            raise CodecError("this Mimi model has no decoder")
        if num_codebooks is None:
            num_codebooks = config.num_quantizers
        lowest = max(1, config.num_semantic_quantizers)
        if not lowest <= num_codebooks <= config.num_quantizers:
            raise CodecError(
                f"Mimi decodes {lowest} to {config.num_quantizers} codebooks, not {num_codebooks}"
            )
        # transformers' signatures are narrower than its behaviour: treat the model as untyped.
        self.model: Any = cast(Any, model)
        self.model.eval()
        self.sample_rate: int = config.sampling_rate
        upsample = model.decoder.upsample
        latent_stride = 1 if upsample is None else upsample.conv.stride[0]
        self.hop_length: int = math.prod(config.upsampling_ratios or ()) * latent_stride
        self.frame_rate: float = self.sample_rate / self.hop_length
        self.num_codebooks: int = num_codebooks
        self.codebook_size: int = config.codebook_size
        self.lookahead_frames = 0  # causal: a frame's audio needs no later frame
        self.streaming_dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` int -> float32 audio ``[B, T * hop_length]``:
        ``MimiModel.decode(codes).audio_values``, which is exactly that long."""
        self.check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0)
        audio = self.model.decode(codes.to(self.device).long()).audio_values
        return audio[:, 0, : codes.shape[-1] * self.hop_length].float()

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """float audio ``[B, N]`` at ``sample_rate`` -> codes ``[B, K, ceil(N / hop_length)]``:
        ``MimiModel.encode(audio[:, None], num_quantizers=K).audio_codes``."""
        if audio.dim() != 2 or audio.shape[-1] == 0:
            raise CodecError(
                f"audio must be a non-empty [batch, samples], got shape {tuple(audio.shape)}"
            )
        if self.model.encoder is None:
            raise CodecError("this Mimi model has no encoder")
        samples = audio[:, None].to(self.device, torch.float32)
        return self.model.encode(samples, num_quantizers=self.num_codebooks).audio_codes

    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """A speech prompt (float32 mono at :attr:`sample_rate`) -> codes ``[K, frames]``."""
        if audio.ndim != 1 or not audio.size:
            raise CodecError("prompt audio must be a non-empty mono array")
        samples = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        return self.encode(samples[None])[0]

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> MimiStreamingDecoder:
        from cadenza.codecs.mimi_streaming import MimiStreamingDecoder

        if compute_dtype not in self.streaming_dtypes:
            raise CodecError(f"Mimi streams in float32 only, not {compute_dtype}")
        return MimiStreamingDecoder(self, max_streams)

    def check_codes(self, codes: torch.Tensor) -> None:
        check_frame_codes(codes, self.num_codebooks, self.codebook_size)


# -- loading --------------------------------------------------------------------------------


def load_mimi(
    name_or_path: str,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_codebooks: int | None = None,
) -> MimiCodec:
    """A Mimi codec from a Hugging Face Mimi directory or a checkpoint embedding one (a Sesame
    CSM checkpoint directory, say).

    ``num_codebooks``: how many codebooks a frame holds (default: every quantizer of a Mimi
    directory; the embedding model's ``num_codebooks``, where its config has one). ``seed`` is
    accepted for the registry's uniform signature; a checkpoint carries all its weights, so it
    changes nothing. Raises :class:`~cadenza.codecs.codec.CodecError` for anything that is not
    one of them.
    """
    del seed
    directory = Path(name_or_path)
    config = _read_config(directory)
    model: Any
    if config.get("model_type") == "mimi":
        model = _load_mimi_directory(directory)
    elif _embeds_mimi(config):
        model = _load_embedded(directory, config)
        if num_codebooks is None and isinstance(config.get("num_codebooks"), int):
            num_codebooks = config["num_codebooks"]
    else:
        raise CodecError(f"{directory}/config.json {_not_mimi(config)}")
    fold_weight_norm(model)
    model.to(torch.device(device), torch.float32)
    _forget_cached_codebooks(model)
    return MimiCodec(model, num_codebooks)


def is_mimi_directory(directory: Path) -> bool:
    """Whether ``directory`` holds a Mimi checkpoint or one embedding Mimi (by its config)."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and (config.get("model_type") == "mimi" or _embeds_mimi(config))


def build_random_mimi(config: MimiConfig, seed: int) -> MimiModel:
    """A Mimi model with weights *and codebooks* drawn from ``seed`` (``transformers``
    initialises every codebook to zero, so all codes would decode alike)."""
    model: Any
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MimiModel(config)
    randomize_codebooks(model, torch.Generator().manual_seed(seed))
    return model.eval()


def randomize_codebooks(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Draw every codebook of a Mimi ``model`` (a ``MimiModel``, or a model embedding one)
    from ``generator``, so that different codes decode differently."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("codebook.embed_sum"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
            elif name.endswith("codebook.cluster_usage"):
                buffer.fill_(1.0)
    _forget_cached_codebooks(model)


def _forget_cached_codebooks(model: torch.nn.Module) -> None:
    """Drop each codebook's cached ``embed`` (computed once from ``embed_sum`` on first use,
    so stale after new weights, a device move or a dtype change)."""
    for module in model.modules():
        if type(module).__name__ == "MimiEuclideanCodebook":
            cast(Any, module)._embed = None


def _read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise CodecError(f"{directory} is not a directory")
    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError as exc:
        raise CodecError(f"{directory}: no config.json") from exc
    except (OSError, ValueError) as exc:
        raise CodecError(f"{directory}/config.json is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CodecError(f"{directory}/config.json is not a JSON object")
    return config


def _mimi_config(values: dict[str, Any], where: str) -> MimiConfig:
    try:
        return MimiConfig.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{where} is not a valid Mimi config: {exc}") from exc


def _load_mimi_directory(directory: Path) -> MimiModel:
    weights = [directory / "model.safetensors", directory / "model.safetensors.index.json"]
    if not any(path.exists() for path in weights):
        raise CodecError(f"{directory}: no model.safetensors (nor its sharded index)")
    return cast(MimiModel, load_strictly(MimiModel, directory, "Mimi", dtype=torch.float32))


def _embeds_mimi(config: dict[str, Any]) -> bool:
    """Whether a model's config describes an embedded Mimi codec (its ``codec_config``)."""
    codec_config = config.get("codec_config")
    return isinstance(codec_config, dict) and codec_config.get("model_type") == "mimi"


def _not_mimi(config: dict[str, Any]) -> str:
    """Why a config is neither Mimi's nor that of a model embedding Mimi (the message goes
    after the file's name)."""
    kind = config.get("model_type")
    codec_config = config.get("codec_config")
    if not isinstance(codec_config, dict):
        return f"is a {kind!r} model with no codec_config: not Mimi, nor a model embedding it"
    codec_kind = codec_config.get("model_type")
    return f"is a {kind!r} model whose codec is {codec_kind!r}: not Mimi, nor a model embedding it"


def _load_embedded(directory: Path, config: dict[str, Any]) -> MimiModel:
    """The Mimi a model's checkpoint embeds: configured by its ``codec_config``, weights
    under :data:`EMBEDDED_CODEC_PREFIX`."""
    model = MimiModel(_mimi_config(config["codec_config"], f"{directory}/config.json codec_config"))
    state = _nested_state(read_prefixed_tensors(directory, EMBEDDED_CODEC_PREFIX))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CodecError(
            f"{directory}: the codec_model weights do not fit its codec_config "
            f"(missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]})"
        )
    return model


def _nested_state(flat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names (flat layout) -> ``MimiModel``'s; names already nested pass through."""
    out = {}
    for name, tensor in flat.items():
        for old, new in _NESTED_PREFIXES:
            if name.startswith(old):
                name = new + name.removeprefix(old)
                break
        out[name] = tensor
    return out
