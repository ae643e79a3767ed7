"""A request's state inside the engine.

Tokens are *rows*: one id per codebook (``num_codebooks`` wide; 1 for a plain or flat-layout
LM). ``token_rows`` holds the prompt then every sampled row. Scheduling brings
``num_computed_tokens`` (rows whose KV is cached) up to ``num_tokens``; when they meet, the
last forward produced logits for the next row::

    token_rows   [ prompt ............ | generated ....... ]
                 0              num_prompt_tokens      num_tokens
    KV cached    [ ........................ ]
                 0                num_computed_tokens
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from cadenza.engine.block_pool import BlockHash
from cadenza.engine.playout_clock import PlayoutClock
from cadenza.engine.request import FinishReason
from cadenza.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_rows: list[list[int]]
    sampling: SamplingParams
    generator: torch.Generator
    max_new_steps: int
    extra_keys: tuple[str, ...] = ()
    eos_ids: frozenset[int] = frozenset()
    target_frames: int = 0
    end_frame: int | None = None
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    reserved_blocks: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    num_preemptions: int = 0
    frames_sent: int = 0
    codec_slot: int | None = None  # the stream's slot in the engine's streaming decoder
    seen_ids: torch.Tensor | None = None  # [K, V] bool, for the repetition penalty
    playout: PlayoutClock | None = None  # audio streams: when each chunk is due

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_rows)
        if not self.token_rows:
            raise ValueError("a sequence needs at least one prompt token")

    @property
    def num_tokens(self) -> int:
        return len(self.token_rows)

    @property
    def num_generated(self) -> int:
        return len(self.token_rows) - self.num_prompt_tokens

    @property
    def output_rows(self) -> list[list[int]]:
        return self.token_rows[self.num_prompt_tokens :]

    @property
    def is_prefilling(self) -> bool:
        """More than the last row still lacks KV (a prompt, or a recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def append(self, row: list[int]) -> None:
        self.token_rows.append(row)
        if self.seen_ids is not None:
            _mark_seen(self.seen_ids, row)

    def seen_mask(self, vocab_size: int) -> torch.Tensor:
        """Which ids each codebook has seen so far (prompt included), as ``[K, V]`` bool."""
        if self.seen_ids is None:
            self.seen_ids = torch.zeros(len(self.token_rows[0]), vocab_size, dtype=torch.bool)
            for row in self.token_rows:
                _mark_seen(self.seen_ids, row)
        return self.seen_ids


def _mark_seen(seen: torch.Tensor, row: list[int]) -> None:
    vocab = seen.shape[1]
    for codebook, token in enumerate(row):
        if 0 <= token < vocab:
            seen[codebook, token] = True
