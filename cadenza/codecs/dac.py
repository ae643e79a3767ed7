"""DAC (Descript Audio Codec) through ``transformers``: offline decoding and encoding of frames.

:func:`load_dac` loads a Hugging Face DAC directory (``config.json`` with ``model_type:
"dac"``, the weights in ``model.safetensors``), such as descript/dac_44khz: 44.1 kHz, 9
codebooks of 1024 codes, 512 samples a frame (86.13 frames a second). Weight normalisation may
be stored under either of its names (:mod:`~cadenza.codecs.weight_norm`: the hub's files hold
the legacy ``weight_g`` / ``weight_v``) or already folded into plain weights; it is folded at
load. ``transformers``' own ``from_pretrained`` cannot load weight-normalised DAC files (its
``DacModel`` has plain convolutions, so it leaves those weights at random), hence this loader.

A frame is ``num_codebooks`` codes of a residual VQ: each code's codebook vector, projected to
the latent by a 1x1 conv, summed over the codebooks. The decoder turns one latent step into
``hop_length`` samples: a centred conv (kernel 7), one block per upsampling ratio ``s`` (Snake,
a transposed conv of kernel ``2s`` and stride ``s``, three residual units of dilations 1, 3,
9), Snake, a centred conv (kernel 7) to one channel and tanh. :meth:`DacCodec.decode` of ``T``
frames gives exactly ``T * hop_length`` samples, equal to ``DacModel.decode`` of the codes.

The decoder is not causal: its convolutions are centred and zero-padded, so a frame's audio
depends on the codes about 4,757 samples either side of it (44.1 kHz model: 9.3 frames;
:attr:`DacCodec.lookahead_frames` is 10).
:class:`~cadenza.codecs.dac_streaming.DacStreamingDecoder` streams the same decode exactly.
Upsampling ratios must be even (an odd one makes its transposed conv drop a sample, which the
streaming stages do not model): descript/dac_44khz's (8, 8, 4, 2) are; a model with a 5 among
them (the 24 kHz one) is refused.

Encoding ``N`` samples gives ``ceil(N / hop_length)`` frames: the audio is zero-padded to whole
frames, as DAC's feature extractor pads it, and the codes are ``DacModel.encode``'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from transformers import DacConfig, DacModel

from cadenza.codecs.codec import CodecError, check_frame_codes
from cadenza.codecs.weight_norm import fold_weight_norm, parametrized_weight_norm_names

if TYPE_CHECKING:
    from cadenza.codecs.dac_streaming import DacStreamingDecoder

# The name's end of a weight-normalised conv's norm, in the parametrisation's spelling.
_NORM = ".parametrizations.weight.original0"


class DacCodec:
    """One DAC model decoding (and encoding) frames of all its codebooks (see the module
    docstring). The model's weight normalisation must be folded (:func:`load_dac` does)."""

    def __init__(self, model: DacModel) -> None:
        config = model.config
        ratios = [int(ratio) for ratio in config.upsampling_ratios]
        if any(ratio % 2 for ratio in ratios):
            raise CodecError(
                f"DAC with an odd upsampling ratio ({ratios}) is not supported: its transposed "
                "conv drops a sample, which streaming does not model"
            )
        # transformers' signatures are narrower than its behaviour: treat the model as untyped.
        self.model: Any = cast(Any, model).eval()
        self.sample_rate: int = int(config.sampling_rate)
        self.hop_length: int = math.prod(ratios)
        self.frame_rate: float = self.sample_rate / self.hop_length
        self.num_codebooks: int = int(config.n_codebooks)
        self.codebook_size: int = int(config.codebook_size)
        self.latent_channels: int = int(config.hidden_size)
        self.streaming_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
        lookahead = self.streaming_decoder(max_streams=1).lookahead_samples
        self.lookahead_frames = math.ceil(lookahead / self.hop_length)  # 44.1 kHz: 10

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, K, T]`` (long, on :attr:`device`) -> the decoder's input ``[B, C, T]``."""
        latent: torch.Tensor = self.model.quantizer.from_codes(codes)[0]
        return latent

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> float32 audio ``[B, T * hop_length]`` in [-1, 1]."""
        self.check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0)
        audio: torch.Tensor = self.model.decode(audio_codes=codes.to(self.device).long())[0]
        return audio.float()

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """float audio ``[B, N]`` at :attr:`sample_rate` -> codes ``[B, K, ceil(N /
        hop_length)]`` (the audio zero-padded to whole frames)."""
        if audio.dim() != 2 or audio.shape[-1] == 0:
            raise CodecError(f"audio must be [batch, samples>0], got shape {tuple(audio.shape)}")
        padded = F.pad(audio.float(), (0, -audio.shape[-1] % self.hop_length))
        codes: torch.Tensor = self.model.encode(padded[:, None].to(self.device)).audio_codes
        return codes

    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """A speech prompt (float32 mono at :attr:`sample_rate`) -> codes ``[K, frames]``.

        Turn-based: a prompt is used only once it is complete, so the offline encoder is the
        exact reference and nothing would be gained encoding it incrementally.
        """
        if audio.ndim != 1 or not audio.size:
            raise CodecError("prompt audio must be a non-empty mono array")
        samples = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        return self.encode(samples[None])[0]

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> DacStreamingDecoder:
        from cadenza.codecs.dac_streaming import DacStreamingDecoder

        if compute_dtype not in self.streaming_dtypes:
            raise CodecError(f"DAC streams in float32 only, not {compute_dtype}")
        return DacStreamingDecoder(self, max_streams)

    def check_codes(self, codes: torch.Tensor) -> None:
        check_frame_codes(codes, self.num_codebooks, self.codebook_size)


# -- loading --------------------------------------------------------------------------------


def is_dac_directory(directory: Path) -> bool:
    """Whether ``directory`` holds a DAC checkpoint (its config's ``model_type`` is ``dac``)."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "dac"


def load_dac(path: str, device: str | torch.device = "cpu", seed: int = 0) -> DacCodec:
    """A DAC codec from a Hugging Face DAC directory, weight normalisation folded, in float32
    on ``device``. ``seed`` is accepted for the registry's uniform signature; a checkpoint
    carries all its weights, so it changes nothing. Raises
    :class:`~cadenza.codecs.codec.CodecError` for a directory that is not a loadable DAC
    checkpoint."""
    del seed
    directory = Path(path)
    # transformers' signatures (``to`` here) are narrower than its behaviour: untyped.
    model: Any = _build_model(directory)
    _load_weights(model, directory)
    fold_weight_norm(model)
    model.to(torch.device(device), torch.float32)
    return DacCodec(model)


def _build_model(directory: Path) -> DacModel:
    """The model ``config.json`` describes, its weights still to load."""
    from huggingface_hub.errors import StrictDataclassError

    if not directory.is_dir():
        raise CodecError(f"{directory} is not a directory")
    try:
        values = json.loads((directory / "config.json").read_text())
    except FileNotFoundError as exc:
        raise CodecError(f"{directory}: no config.json") from exc
    except (OSError, ValueError) as exc:
        raise CodecError(f"{directory}/config.json is not readable JSON: {exc}") from exc
    if not isinstance(values, dict) or values.get("model_type") != "dac":
        raise CodecError(f"{directory}/config.json is not a DAC config (model_type 'dac')")
    try:
        return DacModel(DacConfig.from_dict(values))
    except (TypeError, ValueError, StrictDataclassError) as exc:
        raise CodecError(f"{directory}/config.json is not a valid DAC config: {exc}") from exc


def _load_weights(model: DacModel, directory: Path) -> None:
    """``model.safetensors`` into ``model``, strictly: every weight the config asks for, of its
    shape, and nothing else. A conv stored weight-normalised (under either name) gets the
    parametrisation first, to be folded after."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = directory / "model.safetensors"
    if not weights.exists():
        raise CodecError(f"{directory}: no model.safetensors")
    try:
        state = parametrized_weight_norm_names(load_file(weights))
    except (OSError, SafetensorError) as exc:
        raise CodecError(f"{directory}: cannot read model.safetensors: {exc}") from exc
    except ValueError as exc:  # a tensor named both ways
        raise CodecError(f"{directory}: {exc}") from exc
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and name + _NORM in state:
            weight_norm(module)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CodecError(f"{directory}: the weights do not fit its config: {exc}") from exc
