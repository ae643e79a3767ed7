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
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="most sequences running at once (unset: 64 on the CPU; on CUDA as many "
        "nominal streams as the KV cache holds, up to 256 and max_num_batched_tokens)",
    )
    enable_prefix_caching: bool = Field(True, description="share KV pages of equal prefixes")
    reserve_max_output: bool = Field(
        True,
        description="admit a stream only with KV pages for its whole output (no preemption)",
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="KV cache size in bytes (unset: a fraction of free memory)"
    )
    kv_cache_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=0.95,
        description="share of free device memory for the KV cache (unset: 5 % on the CPU; on "
        "CUDA 90 % of what the weights left, less the CUDA graphs' memory, measured)",
    )

    cuda_graphs: bool = Field(
        True,
        description="on CUDA, decode steps run at fixed batch sizes (1, 2, 4, 8, then steps of "
        "8 and 16 up to max_num_seqs), each captured once as a CUDA graph and replayed; the "
        "graphs' memory is taken before the KV budget. The CPU runs its steps eagerly",
    )

    overlap_steps: bool | None = Field(
        None,
        description="launch each step's forward pass before the previous step's audio is "
        "decoded and sent, so the host's work overlaps the device's (unset: on CUDA; a CPU "
        "computes while it launches, nothing to overlap)",
    )

    @model_validator(mode="after")
    def _budget_covers_every_decode(self) -> EngineConfig:
        if self.max_num_seqs is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be at least max_num_seqs, so every running "
                "sequence can decode in every step"
            )
        return self
