"""KV memory arithmetic for capacity planning (``cadenza plan``).

Per token, a decoder stores a key and a value per layer and KV head::

    kv_bytes_per_token = 2 * layers * kv_heads * head_dim * bytes(kv_dtype)   (+ int8 scales)

INT8 caches also keep one float16 scale per token, layer, KV head and K/V, which adds
``2 * layers * kv_heads * 2`` bytes per token (as the engine's cache does,
:mod:`cadenza.kernels.kv_quant`). Llama 3 8B (32 layers, 8 KV heads of width 128,
BF16) needs 131,072 bytes per token: exactly 1 GiB for an 8,192-token sequence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KV_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}
INT8_SCALE_BYTES = 2

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"512 MiB"``, ``"1e9"``, ``"80GB"`` -> bytes. Raises ``ValueError``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 24GiB, 512MiB, 1e9)")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value)


@dataclass(frozen=True)
class KVPlan:
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    context: int
    heads: int | None = None
    batch: int | None = None
    memory_bytes: int | None = None
    weights_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPE_BYTES)}")
        if self.heads is not None and (self.heads < self.kv_heads or self.heads % self.kv_heads):
            raise ValueError("heads must be a multiple of kv_heads")
        if self.batch is not None and self.batch < 1:
            raise ValueError("batch must be at least 1")
        if self.weights_bytes < 0:
            raise ValueError("weights_bytes must not be negative")

    def bytes_per_token(self, kv_heads: int) -> int:
        per_token = 2 * self.layers * kv_heads * self.head_dim * KV_DTYPE_BYTES[self.kv_dtype]
        if self.kv_dtype == "int8":
            per_token += 2 * self.layers * kv_heads * INT8_SCALE_BYTES
        return per_token

    @property
    def kv_bytes_per_token(self) -> int:
        return self.bytes_per_token(self.kv_heads)

    @property
    def kv_bytes_per_sequence(self) -> int:
        return self.kv_bytes_per_token * self.context

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "layers": self.layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "kv_dtype": self.kv_dtype,
            "context": self.context,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
        }
        if self.heads is not None:
            result["heads"] = self.heads
            result["mha_to_gqa_ratio"] = self.heads // self.kv_heads
            result["mha_kv_bytes_per_token"] = self.bytes_per_token(self.heads)
        if self.memory_bytes is not None:
            budget = max(self.memory_bytes - self.weights_bytes, 0)
            result["memory_bytes"] = self.memory_bytes
            result["weights_bytes"] = self.weights_bytes
            result["kv_budget_bytes"] = budget
            result["sequences_that_fit"] = budget // self.kv_bytes_per_sequence
        if self.batch is not None:
            needed = self.batch * self.kv_bytes_per_sequence
            result["batch"] = self.batch
            result["kv_bytes_for_batch"] = needed
            if self.memory_bytes is not None:
                result["batch_fits"] = needed <= result["kv_budget_bytes"]
        return result
