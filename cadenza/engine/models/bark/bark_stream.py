"""A Bark stream's state on the engine: its voice and where it stands in the three stages
(what :class:`~cadenza.engine.models.bark.bark_layout.BarkLayout` reads and advances after
each row, and what :class:`~cadenza.engine.models.bark.bark_model.BarkModel` reads in a step:
the voice's semantic history)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import torch

from cadenza.engine.models.bark.bark_constants import BarkConstants
from cadenza.engine.models.bark.bark_voices import VoicePreset
from cadenza.engine.models.bark.bark_windows import CoarseHistory, FineWindows, semantic_prompt
from cadenza.engine.models.stream_state import StreamState


class BarkStage(enum.Enum):
    SEMANTIC = "semantic"
    COARSE = "coarse"
    DONE = "done"


@dataclass
class BarkStreamState:
    """``semantic_history``: the voice's semantic ids as the semantic prompt sums them into its
    first positions (padded). Progress: the semantic tokens; the coarse history and every
    coarse token so far (flattened, as the coarse stage reads them), the tokens of the window
    being decoded, how many the stream makes; the fine stage's buffer and its next window; the
    next context's prompt, until the scheduler takes it."""

    voice: VoicePreset | None
    semantic_history: torch.Tensor  # [max_input_semantic_length] int64
    fine_temperature: float | None  # None: greedy
    stage: BarkStage = BarkStage.SEMANTIC
    semantic: list[int] = field(default_factory=list)
    semantic_capped: bool = False  # the semantic tokens ended at the stream's length
    history: CoarseHistory = field(default_factory=lambda: CoarseHistory([], []))
    coarse: list[int] = field(default_factory=list)
    window_tokens: list[int] = field(default_factory=list)
    coarse_target: int = 0
    fine: FineWindows | None = None
    fine_window: int = 0  # the next fine window to run
    final_frames: int = 0  # frames no later fine window changes
    next_prompt: list[int] | None = None
    nbytes: int = 0

    @classmethod
    def begin(
        cls, voice: VoicePreset | None, constants: BarkConstants, fine_temperature: float | None
    ) -> BarkStreamState:
        _, history = semantic_prompt([], voice, constants)
        return cls(voice, history, fine_temperature, nbytes=history.numel() * 8)

    @property
    def coarse_generated(self) -> int:
        return len(self.coarse) - len(self.history.coarse)


def state_bytes(constants: BarkConstants) -> int:
    """The most memory one stream's state holds: its codes through the fine stage (int64 rows
    of every codebook, the voice's fine history and one window's padding included), its
    semantic and coarse tokens and histories, at Bark's longest utterance."""
    c = constants
    frames = math.ceil(
        c.max_new_semantic_tokens * c.semantic_to_coarse_ratio / c.n_coarse_codebooks
    )
    rows = frames + c.max_fine_history_length + c.max_fine_input_length
    tokens = c.max_new_semantic_tokens + c.max_input_semantic_length + 2 * frames
    return 8 * (rows * c.n_fine_codebooks + tokens + c.max_coarse_history)


def bark_state(state: StreamState | None) -> BarkStreamState:
    if not isinstance(state, BarkStreamState):
        raise TypeError(f"not a Bark stream's state: {type(state).__name__}")
    return state
