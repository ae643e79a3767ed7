"""The engine's real-time contract with its streams, announced once in ``ready``.

The engine owns every quantity here: it rescales the configured chunk durations to its codec's
frames, adds the frames the codec looks ahead (SNAC: 3) to the first chunk (the chunk rule,
``cadenza.engine.chunk_policy.config_in_codec_frames``), and knows how many decode steps the
first chunk takes after the prompt (its layout's delay pattern included).
Admission reads them from :attr:`EngineInfo.realtime` and never models them again.

A stream's first chunk is due ``ttfa_target_s`` after it arrives, later for a prompt longer
than the nominal one (:meth:`RealtimePlan.first_chunk_due_after_s`): a long prompt costs its own
prefill, ``prompt_ttfa_multiple`` times over, so that many such prompts arriving together all
start by their deadlines while a short prompt's deadline stays the TTFA target (and, ordered by
deadline, short prompts are prefilled first).
"""

from __future__ import annotations

from dataclasses import dataclass

from cadenza.contract.step_time_model import StepTimeModel, step_budget_s


@dataclass(frozen=True)
class RealtimePlan:
    """``step_period_s``: one frame period over the steps a frame takes (a real-time stream
    needs one step that often); ``first_chunk_frames`` / ``chunk_frames``: codec frames per
    chunk as the engine cuts them (the first one with ``lookahead_frames`` included);
    ``first_chunk_steps``: decode steps after the prompt until the first chunk can be decoded;
    ``max_lead_s``: how far ahead of its listener the engine runs a stream before it rests;
    ``nominal_prompt_rows``: the prompt rows of the nominal stream's text, at most
    (:attr:`~cadenza.contract.kv_memory.StreamShape.nominal_prompt_tokens`)."""

    step_period_s: float
    headroom: float
    ttfa_target_s: float
    playout_reserve_s: float
    first_chunk_frames: int
    first_chunk_steps: int
    chunk_frames: int
    lookahead_frames: int
    max_lead_s: float
    nominal_prompt_rows: int
    prompt_ttfa_multiple: float = 0.0

    @property
    def step_budget_s(self) -> float:
        """The longest step that keeps every stream real-time, headroom kept free."""
        return step_budget_s(self.step_period_s, 1, self.headroom)

    @property
    def first_chunk_work_s(self) -> float:
        """What producing the first chunk after the prompt takes at the step budget."""
        return self.first_chunk_steps * self.step_budget_s

    def first_chunk_due_after_s(self, prompt_rows: int, model: StepTimeModel | None) -> float:
        """How long after its arrival a stream with ``prompt_rows`` prompt rows has its first
        chunk due: the TTFA target, plus ``prompt_ttfa_multiple`` times what its prompt takes
        to prefill beyond a nominal one's at the calibrated speed (nothing more without a
        step-time model)."""
        if model is None or self.prompt_ttfa_multiple <= 0:
            return self.ttfa_target_s
        extra_ms = model.prefill_ms(prompt_rows) - model.prefill_ms(self.nominal_prompt_rows)
        return self.ttfa_target_s + self.prompt_ttfa_multiple * max(extra_ms, 0.0) / 1000.0
