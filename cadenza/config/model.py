"""``[model]`` and ``[[models]]``: which models the engines serve, and on what device."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadenza.config.section import Section


class ModelConfig(Section):
    """Which model the engine serves and on what device."""

    name: str = Field(
        "cadenza-tiny",
        description="a built-in model name, a local checkpoint directory, or a hub id "
        "(owner/name) in the local Hugging Face cache",
    )
    codec: str | None = Field(
        None,
        description="the codec to decode with instead of the one the model names (a built-in "
        "name: encodec_24khz, snac_24khz; a directory; or a hub id in the local cache)",
    )
    codec_noise: bool = Field(
        True, description="SNAC's noise layers (off: reproducible audio for the same tokens)"
    )
    served_name: str | None = Field(
        None, description="the name clients ask for this model by (default: name)"
    )

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks cuda when available, else cpu"
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="weight and activation dtype (auto: float32 on cpu, bfloat16 on cuda). "
        "Named, it is the dtype of every product and of the KV cache; auto lets the engine "
        "lower products, KV cache and codec where measured, and says so (docs/precision.md)",
    )
    seed: int = Field(0, description="seed that builds the weights of built-in random models")
    weights_dtype: Literal["auto", "int8"] = Field(
        "auto",
        description="int8: weight-only int8 linears with per-output-channel scales (W8A16)",
    )
    torch_threads: int = Field(
        0, ge=0, description="intra-op threads for torch in the engine (0: torch's default)"
    )

    @property
    def public_name(self) -> str:
        return self.served_name or self.name


class ServedModel(Section):
    """One ``[[models]]`` entry: a model this server serves, in its own engine process."""

    name: str = Field(min_length=1, max_length=128, description="the name clients use")
    path: str = Field(min_length=1, description="built-in name, checkpoint directory or hub id")
    codec: str | None = Field(None, description="codec instead of the one the model names")
