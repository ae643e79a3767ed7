"""The dtypes an engine computes in, announced in ``ready`` so that ``/readyz``, the start-up
log and ``cadenza plan`` say them.

A dtype the user names (``model.dtype = "float32"``) is the dtype of every product and of the
KV cache; ``auto`` may choose a faster lower precision where it was measured (bf16 products,
KV cache and codec on a CPU with bf16 matrix units), and :attr:`Precision.lowered` lists what
it lowered. Logits are float32 whatever the products run in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Precision:
    """``weights``: the dtype the model's weights are kept in; ``products``: what the linear
    layers multiply in (bf16: inputs rounded to bf16, sums float32); ``logits``: the output
    heads' dtype; ``kv_cache``: the cache's (``fp32``, ``bf16``, ``fp16``, ``int8``);
    ``codec``: what the streaming codec decodes in (``none`` without a codec); ``chosen_by``:
    ``named`` when the user named the model's dtype, ``auto`` when the engine chose;
    ``lowered``: the parts ``auto`` put below the weights' precision."""

    weights: str
    products: str
    kv_cache: str
    codec: str
    chosen_by: Literal["auto", "named"]
    lowered: tuple[str, ...] = ()
    logits: str = "float32"

    def describe(self) -> str:
        """One line for the log and ``cadenza plan``."""
        parts = [
            f"{self.weights} weights",
            f"{self.products} products",
            f"{self.logits} logits",
            f"{self.kv_cache} KV cache",
        ]
        if self.codec != "none":
            parts.append(f"{self.codec} codec")
        how = "named" if self.chosen_by == "named" else "auto"
        if self.lowered:
            how += f", lowered for speed: {', '.join(self.lowered)}; docs/precision.md"
        return f"{'; '.join(parts)} ({how})"
