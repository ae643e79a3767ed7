"""A request's state inside the engine.

Tokens are *rows*: one id per codebook (``num_codebooks`` wide; 1 for a plain or flat-layout
LM). ``token_rows`` holds the prompt then every sampled row. Scheduling brings
``num_computed_tokens`` (rows whose KV is cached) up to ``num_tokens``; when they meet, the
last forward produced logits for the next row::

    token_rows   [ prompt ............ | generated ....... ]
                 0              num_prompt_tokens      num_tokens
    KV cached    [ ........................ ]
                 0                num_computed_tokens

A restarting layout (:class:`~cadenza.engine.layouts.token_layout.ContextRestarts`) may
replace the rows with a fresh context's prompt (:meth:`Sequence.begin_context`).

Who writes what: the scheduler (``status``, ``num_computed_tokens``, new rows and contexts,
the ending),
the KV cache manager (``page_table``, ``page_hashes``, ``reserved_pages``), the model runner
(a stateful model's ``model_state``) and, for audio streams, the audio stage (``audio``).
Everything else is fixed when the request is taken in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.page_pool import PageHash
from cadenza.engine.models.stream_state import StreamConditioning, StreamState
from cadenza.engine.realtime.playout_clock import PlayoutClock


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class AudioProgress:
    """Where an audio stream's sound stands: its slot in the streaming codec (``None`` before
    it opens and after it closes), the frames decoded and sent so far, the generated rows its
    outputs have carried so far, and when each chunk is due at the listener. A resumed stream
    that makes its heard frames again (a restarting layout's) has them replayed into its slot
    once they are made (``replay_pending``)."""

    playout: PlayoutClock
    codec_slot: int | None = None
    frames_sent: int = 0
    rows_sent: int = 0
    replay_pending: bool = False  # a resumed stream whose heard frames are not made again yet


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_rows: list[list[int]]
    sampling: SamplingParams
    generator: torch.Generator
    max_new_steps: int
    extra_keys: tuple[str, ...] = ()  # prefix-cache keys: model, dtypes, conditioning
    eos_ids: frozenset[int] = frozenset()
    target_frames: int = 0  # codec frames the stream ends after, unless the model ends first
    max_context: int | None = None  # most positions a context holds (a restarting layout's)
    audio: AudioProgress | None = None  # audio streams only
    conditioning: StreamConditioning | None = None  # a stateful model's, from the request
    model_state: StreamState | None = None  # made by the runner at the stream's first step
    # Progress, written by the scheduler.
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    end_frame: int | None = None  # frames in the utterance, once known
    finish_reason: FinishReason | None = None
    error: str | None = None
    num_preemptions: int = 0
    # KV pages, written by the KV cache manager.
    page_table: list[int] = field(default_factory=list)
    page_hashes: list[PageHash] = field(default_factory=list)
    reserved_pages: int = 0
    prefix_pages: int = 0  # the first pages of page_table, found in the prefix cache
    # Rows appended over the stream's life (every context, resumed rows too): the counter of
    # its random draws (cadenza.engine.stream_draws).
    rows_drawn: int = 0

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

    @property
    def frames_sent(self) -> int:
        return 0 if self.audio is None else self.audio.frames_sent

    def append(self, row: list[int]) -> None:
        self.token_rows.append(row)
        self.rows_drawn += 1

    def begin_context(self, rows: list[list[int]]) -> None:
        """Make ``rows`` the prompt of a fresh context (a restarting layout's next one: the
        KV cache manager has released the old context's pages). Rows sent on in outputs count
        from the new context."""
        if not rows:
            raise ValueError("a context needs at least one prompt row")
        self.token_rows = [list(row) for row in rows]
        self.num_prompt_tokens = len(rows)
        if self.audio is not None:
            self.audio.rows_sent = 0
