"""A codec embedded in a model's checkpoint (Sesame CSM's Mimi under ``codec_model.``,
MusicGen's EnCodec under ``audio_encoder.``): its tensors read out of the model's safetensors,
and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cadenza.codecs.codec import CodecError


def read_prefixed_tensors(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every ``prefix`` tensor of the checkpoint in ``directory`` (``model.safetensors`` or
    the shards its index names), prefix stripped; the other tensors (the language model's,
    by far the most) are not read. Raises :class:`CodecError` when there are none or the
    files cannot be read."""
    from safetensors import SafetensorError, safe_open

    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    files: dict[Path, list[str]] = {}
    try:
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, file in weight_map.items():
                if name.startswith(prefix):
                    files.setdefault(directory / file, []).append(name)
        elif single.exists():
            with safe_open(single, "pt") as handle:
                files[single] = [n for n in handle.keys() if n.startswith(prefix)]  # noqa: SIM118
        else:
            raise CodecError(f"{directory}: no model.safetensors (nor its sharded index)")
        tensors: dict[str, torch.Tensor] = {}
        for file, names in files.items():
            with safe_open(file, "pt") as handle:
                for name in names:
                    tensors[name.removeprefix(prefix)] = handle.get_tensor(name)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise CodecError(f"{directory}: cannot read the checkpoint's weights: {exc}") from exc
    if not tensors:
        raise CodecError(f"{directory}: the checkpoint holds no {prefix}* weights")
    return tensors
