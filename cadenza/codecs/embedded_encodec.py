"""The EnCodec a checkpoint embeds: a MusicGen's (facebook/musicgen-small and its kin: the
``audio_encoder`` sub-config, tensors prefixed ``audio_encoder.``) or a Bark's (suno/bark,
suno/bark-small: ``codec_config``, tensors prefixed ``codec_model.``), from the checkpoint's
safetensors (one file or shards), weight norm under either of its names
(:mod:`~cadenza.codecs.weight_norm`; the hub's files hold the legacy ``weight_g`` /
``weight_v``). The codec decodes as many codebooks as the model predicts per audio channel
(musicgen-small: 4, the 32 kHz model's only bandwidth, 2.2 kbps; Bark: its fine stage's 8,
6 kbps at 24 kHz).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import EncodecConfig, EncodecModel

from cadenza.codecs.codec import CodecError
from cadenza.codecs.encodec import EncodecCodec, bandwidth_for_codebooks, default_bandwidth
from cadenza.codecs.prefixed_weights import read_prefixed_tensors
from cadenza.codecs.weight_norm import fold_weight_norm, parametrized_weight_norm_names

EMBEDDED_PREFIX = "audio_encoder."
"""Where a MusicGen checkpoint keeps its EnCodec's tensors."""

HOSTS = (("audio_encoder", EMBEDDED_PREFIX), ("codec_config", "codec_model."))
"""Where each kind of checkpoint keeps its EnCodec: the sub-config, the tensors' prefix."""


def _host(config: dict[str, Any]) -> tuple[str, str] | None:
    for key, prefix in HOSTS:
        values = config.get(key)
        if isinstance(values, dict) and values.get("model_type") == "encodec":
            return key, prefix
    return None


def is_embedded_encodec_directory(directory: Path) -> bool:
    """Whether ``directory``'s config.json has a sub-config that is an EnCodec's: an
    ``audio_encoder`` (MusicGen, MusicGen-Melody) or a ``codec_config`` (Bark)."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    return _host(config) is not None


def load_embedded_encodec(
    path: str, device: str | torch.device = "cpu", seed: int = 0
) -> EncodecCodec:
    """The EnCodec embedded in the checkpoint directory ``path``, weight norm folded, float32 on
    ``device``, at the bandwidth of the codebooks the model predicts (a MusicGen decoder's per
    audio channel, a Bark fine stage's; otherwise the EnCodec config's own default). ``seed``
    is accepted for the registry's uniform signature; the checkpoint holds every weight, so it
    changes nothing.
    Raises :class:`~cadenza.codecs.codec.CodecError` for a directory without a loadable
    embedded EnCodec (its config, or weights missing, unexpected or misshapen)."""
    del seed
    directory = Path(path)
    config = _read_config(directory)
    host = _host(config)
    if host is None:
        raise CodecError(f"{directory}/config.json has no EnCodec audio_encoder or codec_config")
    key, prefix = host
    values = config[key]
    try:
        encodec_config = EncodecConfig.from_dict(values)
    except (TypeError, ValueError, StrictDataclassError) as exc:  # the last: a field's type
        raise CodecError(f"{directory}: {key} is no valid EnCodec config: {exc}") from exc
    model: Any
    with torch.random.fork_rng(devices=[]):  # every weight is loaded over the initial ones
        model = EncodecModel(encodec_config)
    tensors = read_prefixed_tensors(directory, prefix)
    try:
        model.load_state_dict(parametrized_weight_norm_names(tensors), strict=True)
    except (ValueError, RuntimeError) as exc:
        raise CodecError(f"{directory}: the {key} weights do not fit: {exc}") from exc
    fold_weight_norm(model)
    model.float().to(torch.device(device)).eval()
    return EncodecCodec(model, _bandwidth(config, encodec_config))


def _bandwidth(config: dict[str, Any], encodec_config: EncodecConfig) -> float:
    fine = config.get("fine_acoustics_config")
    if isinstance(fine, dict):  # Bark: every codebook its fine stage fills in
        return bandwidth_for_codebooks(encodec_config, int(fine.get("n_codes_total", 8)))
    decoder = config.get("decoder")
    if not isinstance(decoder, dict) or "num_codebooks" not in decoder:
        return default_bandwidth(encodec_config)
    channels = int(decoder.get("audio_channels", 1))
    return bandwidth_for_codebooks(encodec_config, int(decoder["num_codebooks"]) // channels)


def _read_config(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError as exc:
        raise CodecError(f"{directory}: no config.json") from exc
    except (OSError, ValueError) as exc:
        raise CodecError(f"{directory}/config.json is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CodecError(f"{directory}/config.json is not a JSON object")
    return config
