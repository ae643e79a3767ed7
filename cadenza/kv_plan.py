"""KV memory arithmetic for capacity planning (``cadenza plan``): bytes per token and per
sequence, sequences that fit in a memory budget, and what full multi-head attention would cost
instead. The per-token formula is the one the engine and admission use
(:func:`cadenza.contract.kv_memory.kv_bytes_per_token`); this module only plans with it. A
model that keeps per-stream state (an encoder-decoder's cross-attention keys and values) has
a second KV class, priced per sequence at its longest text (the engine sets it aside for each
stream it runs at once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cadenza.contract.kv_memory import KV_DTYPE_BYTES, kv_bytes_per_token

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
    state_bytes_per_sequence: int = 0  # a second KV class: per stream, not per token

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
        return kv_bytes_per_token(self.layers, kv_heads, self.head_dim, self.kv_dtype)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.bytes_per_token(self.kv_heads)

    @property
    def kv_bytes_per_sequence(self) -> int:
        """Paged KV of ``context`` tokens plus the per-stream state, if the model keeps one."""
        return self.kv_bytes_per_token * self.context + self.state_bytes_per_sequence

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
        if self.state_bytes_per_sequence:
            result["paged_kv_bytes_per_sequence"] = self.kv_bytes_per_token * self.context
            result["state_bytes_per_sequence"] = self.state_bytes_per_sequence
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
