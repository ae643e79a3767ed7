"""How Bark's tokens become audio frames on the engine: a layout whose streams run through
several contexts (:class:`~cadenza.engine.layouts.token_layout.ContextRestarts`).

A stream's first context is the semantic stage: its tokens end at the end token (or at the
stream's length: :func:`semantic_token_cap`). Then it knows how many frames it makes, and each
coarse window is a context of its own: the window's prompt
(:func:`~cadenza.engine.models.bark.bark_windows.coarse_window_prompt`), prefilled from position
0, then its tokens, the two codebooks alternating (one mask each). When a window's tokens are
in, every fine window whose coarse codes they complete runs at once, in that step, on the
stream's own generator, and the frames no later fine window changes are ready for the codec;
after the last coarse window the last fine window runs and the stream ends. Every rule follows
``transformers``' ``BarkModel.generate`` for one stream (:mod:`bark_windows`).

The layout keeps a stream's progress in its model state (:class:`BarkStreamState`, made when
the stream first runs); it never writes to the sequence itself.
"""

from __future__ import annotations

import math

import torch

from cadenza.contract.request import FinishReason
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.models.bark.bark_constants import BarkConstants
from cadenza.engine.models.bark.bark_gpt import BarkFineGPT
from cadenza.engine.models.bark.bark_stream import BarkStage, BarkStreamState, bark_state
from cadenza.engine.models.bark.bark_windows import (
    coarse_allowed,
    coarse_codes,
    coarse_history,
    coarse_tokens_for,
    coarse_window_prompt,
    fine_windows,
)
from cadenza.engine.sequence import Sequence

SEMANTIC, COARSE = 0, 1
"""A row's second id: the stage that reads it (forced by :meth:`BarkLayout.constraints`)."""

SEMANTIC_MASK, COARSE_FIRST_MASK, COARSE_SECOND_MASK = 0, 1, 2


def semantic_token_cap(target_frames: int, constants: BarkConstants) -> int:
    """The most semantic tokens a stream of ``target_frames`` frames makes (Bark's limit, or
    fewer for a shorter stream: the semantic tokens of that much audio, rounded up)."""
    per_frame = constants.semantic_rate_hz / constants.coarse_rate_hz
    return max(1, min(constants.max_new_semantic_tokens, math.ceil(target_frames * per_frame)))


class BarkLayout:
    """Bark's layout (see the module docstring); ``max_context`` is the longer of the semantic
    context (its prompt and every token) and a coarse window's; ``context_rows_per_frame`` the
    coarse windows' prompts per frame (29.6 rows with the published windows: Bark's steady
    work is mostly these prefills, not its decode steps)."""

    num_codebooks = 2  # the id, then the stage that reads it (forced)
    produces_audio = True
    # Decode steps a frame takes, rounded up: two coarse tokens and 49.9/75 of a semantic one
    # (the coarse windows' prompts come on top, as prefill).
    steps_per_frame = 3
    tail_steps = 0

    def __init__(
        self, constants: BarkConstants, vocab_size: int, coarse_vocab: int, fine: BarkFineGPT
    ) -> None:
        """``vocab_size``: the logits' width; ``coarse_vocab``: the coarse stage's output ids;
        ``fine``: the fine stage, run on the streams' windows."""
        c = constants
        self.fine = fine
        self.constants = c
        self.codebooks_per_frame = c.n_fine_codebooks
        coarse_prompt = c.max_coarse_input_length + 1 + c.max_coarse_history
        self.max_context = max(
            c.max_input_semantic_length + 1 + c.max_new_semantic_tokens,
            coarse_prompt + c.sliding_window_len,
        )
        # Every window of sliding_window_len coarse tokens (half as many frames) is prefilled.
        self.context_rows_per_frame = coarse_prompt * c.n_coarse_codebooks / c.sliding_window_len
        masks = torch.zeros(3, 2, vocab_size, dtype=torch.bool)
        masks[SEMANTIC_MASK, 0, : c.semantic_end_token + 1] = True
        masks[SEMANTIC_MASK, 1, SEMANTIC] = True
        for mask, step in ((COARSE_FIRST_MASK, 0), (COARSE_SECOND_MASK, 1)):
            low, high = coarse_allowed(step, c, coarse_vocab)
            masks[mask, 0, low:high] = True
            masks[mask, 1, COARSE] = True
        self._masks = masks

    def sampling_masks(self) -> torch.Tensor | None:
        return self._masks

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        if seq.model_state is None or bark_state(seq.model_state).stage is BarkStage.SEMANTIC:
            return SEMANTIC_MASK, [None, SEMANTIC]
        return COARSE_FIRST_MASK + seq.num_generated % 2, [None, COARSE]

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        state = bark_state(seq.model_state)
        if state.stage is BarkStage.SEMANTIC:
            return self._semantic_token(seq, state, row[0])
        if state.stage is BarkStage.COARSE:
            return self._coarse_token(seq, state, row[0])
        raise ValueError(f"{seq.request_id}: a row after the stream's last frame")

    def next_context(self, seq: Sequence) -> list[list[int]] | None:
        state = bark_state(seq.model_state)
        prompt, state.next_prompt = state.next_prompt, None
        return None if prompt is None else [[token, COARSE] for token in prompt]

    def frames_ready(self, seq: Sequence) -> int:
        return 0 if seq.model_state is None else bark_state(seq.model_state).final_frames

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        fine = bark_state(seq.model_state).fine
        if fine is None or end > fine.frames:
            raise ValueError(f"{seq.request_id}: frames {start}..{end} are not made yet")
        rows = fine.buffer[fine.history + start : fine.history + end]
        codes: list[list[int]] = rows.tolist()
        return codes

    # -- the stages ---------------------------------------------------------------------------

    def _semantic_token(self, seq: Sequence, state: BarkStreamState, token: int) -> RowOutcome:
        c = self.constants
        end = c.semantic_end_token
        if token != end:
            state.semantic.append(token)
        capped = seq.num_generated >= semantic_token_cap(seq.target_frames, c)
        if token != end and not capped:
            return None, None
        state.semantic_capped = token != end
        state.stage = BarkStage.COARSE
        state.history = coarse_history(state.voice, c)
        state.coarse = list(state.history.coarse)
        state.coarse_target = coarse_tokens_for(len(state.semantic), c)
        frames = state.coarse_target // c.n_coarse_codebooks
        if frames == 0:
            state.stage = BarkStage.DONE
            return 0, self._ending(state)
        state.fine = fine_windows(frames, state.voice, c)
        state.nbytes += state.fine.buffer.numel() * 8
        state.next_prompt = self._coarse_prompt(state)
        return frames, None

    def _coarse_token(self, seq: Sequence, state: BarkStreamState, token: int) -> RowOutcome:
        c, fine = self.constants, state.fine
        assert fine is not None
        state.window_tokens.append(token)
        window = min(c.sliding_window_len, state.coarse_target - state.coarse_generated)
        if len(state.window_tokens) < window:
            return fine.frames, None
        fine.put_coarse(coarse_codes(state.window_tokens, c))
        state.coarse.extend(state.window_tokens)
        state.window_tokens = []
        self._run_fine_windows(state, seq.generator)
        if state.coarse_generated >= state.coarse_target:
            state.stage = BarkStage.DONE
            return fine.frames, self._ending(state)
        state.next_prompt = self._coarse_prompt(state)
        return fine.frames, None

    @staticmethod
    def _ending(state: BarkStreamState) -> FinishReason:
        return FinishReason.LENGTH if state.semantic_capped else FinishReason.EOS

    def _coarse_prompt(self, state: BarkStreamState) -> list[int]:
        return coarse_window_prompt(
            state.history.semantic + state.semantic,
            len(state.history.semantic),
            state.coarse,
            state.coarse_generated,
            self.constants,
        )

    @torch.inference_mode()
    def _run_fine_windows(self, state: BarkStreamState, generator: torch.Generator) -> None:
        """Run every fine window whose coarse codes are in; the frames now final."""
        c, fine = self.constants, state.fine
        assert fine is not None
        device = next(self.fine.parameters()).device
        width = c.max_fine_input_length
        while state.fine_window < len(fine.windows) and fine.ready(state.fine_window, width):
            start, fill_start = fine.windows[state.fine_window]
            fill = fill_start - start
            inputs = fine.buffer[start : start + width][None].to(device)
            for codebook in range(c.n_coarse_codebooks, c.n_fine_codebooks):
                logits = self.fine(inputs, codebook)[0, fill:, : c.codebook_size]
                inputs[0, fill:, codebook] = _pick_rows(logits, state.fine_temperature, generator)
            fine.buffer[start + fill : start + width] = inputs[0, fill:].cpu()
            state.fine_window += 1
            state.final_frames = fine.final_after(state.fine_window - 1)


def _pick_rows(
    logits: torch.Tensor, temperature: float | None, generator: torch.Generator
) -> torch.Tensor:
    """Per row of ``logits [T, V]``: the largest's index, or a draw at ``temperature``."""
    if temperature is None:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
