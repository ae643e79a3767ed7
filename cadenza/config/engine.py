"""``[engine]``: the engine itself, its batch and its KV cache (``cadenza/engine/``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cadenza.config.section import Section


class EngineConfig(Section):
    """Which engine serves, how many sequences one step batches and how much KV it holds."""

    kind: Literal["cadenza", "naive"] = Field(
        "cadenza",
        description="cadenza: the batching engine; naive: one thread per request with the "
        "transformers model and offline codec decode (a baseline for load tests)",
    )
    max_pending_requests: int = Field(
        256, ge=1, description="requests the engine holds (running + waiting) before refusing"
    )
    page_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    kv_dtype: Literal["auto", "fp32", "fp16", "bf16", "int8"] = Field(
        "auto",
        description="KV cache dtype (auto: the model's, except bf16 where a float32 model's "
        "steps run fused on the CPU with bf16 products and model.dtype is auto; int8: "
        "per-token-per-head scales, about twice the tokens of fp16 per byte)",
    )
    max_num_batched_tokens: int = Field(
        512, ge=1, description="token budget of one engine step (decodes + prefill chunks)"
    )
    max_num_seqs: int = Field(64, ge=1, description="most sequences running at once")
    enable_prefix_caching: bool = Field(True, description="share KV pages of equal prefixes")
    reserve_max_output: bool = Field(
        True,
        description="admit a stream only with KV pages for its whole output (no preemption)",
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="KV cache size in bytes (unset: a fraction of free memory)"
    )
    kv_cache_memory_fraction: float = Field(
        0.05,
        gt=0,
        le=0.95,
        description="share of free device memory for the KV cache (raise it on a GPU)",
    )

    @model_validator(mode="after")
    def _budget_covers_every_decode(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be at least max_num_seqs, so every running "
                "sequence can decode in every step"
            )
        return self
