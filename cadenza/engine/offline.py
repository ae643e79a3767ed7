"""Offline use of an engine, without a server: token ids for exactness checks, whole
utterances for ``cadenza generate``. Both run the engine's ordinary steps."""

from __future__ import annotations

import secrets

import numpy as np

from cadenza.contract.request import ContextTurn, FinishReason, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.sequence import SequenceStatus


def generate_ids(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    greedy: bool = True,
    seed: int | None = None,
) -> list[list[int]]:
    """Continue each prompt (token ids) by up to ``max_new_tokens``, stopping after an EOS
    id, as ``transformers``' ``generate`` does; all prompts batched together. Only for
    one-codebook models. Raises ``RuntimeError`` if a request fails."""
    if engine.layout.num_codebooks != 1:
        raise TypeError("generate_ids needs a one-token-per-step model")
    seqs = []
    for index, prompt in enumerate(prompts):
        params = SamplingParams(
            temperature=0.0 if greedy else 1.0,
            top_k=0,
            seed=None if seed is None else seed + index,
        )
        request_id = f"ids-{secrets.token_hex(6)}"
        seqs.append(engine.add_tokens(request_id, [[t] for t in prompt], max_new_tokens, params))
    while any(seq.status is not SequenceStatus.FINISHED for seq in seqs):
        engine.step()
    for seq in seqs:
        if seq.finish_reason is FinishReason.ERROR:
            raise RuntimeError(f"generation failed: {seq.error}")
    return [[row[0] for row in seq.output_rows] for seq in seqs]


def synthesize(
    engine: Engine,
    text: str,
    *,
    voice: str = "default",
    max_duration_s: float | None = None,
    sampling: SamplingParams | None = None,
    context: tuple[ContextTurn, ...] = (),
    prompt_audio: bytes = b"",
) -> np.ndarray:
    """The whole utterance as float32 mono audio at the codec's rate, after the conversation
    ``context`` (its audio at the codec's rate; a model that takes context), in the voice of
    ``prompt_audio`` (float32 samples at the codec's rate; none: ``voice``'s). Raises
    :class:`~cadenza.contract.errors.RequestRejected` for a request the engine refuses,
    ``RuntimeError`` if synthesis fails."""
    request_id = f"offline-{secrets.token_hex(6)}"
    request = SynthesisRequest(
        request_id,
        text,
        voice,
        max_duration_s,
        sampling or engine.model.default_sampling,
        prompt_audio=prompt_audio,
        prompt_sample_rate=engine.sample_rate,
        context=context,
    )
    engine.add_request(request)
    pieces: list[np.ndarray] = []
    while True:
        for output in engine.step():
            if output.request_id != request_id:
                continue
            pieces.append(output.audio)
            if output.finish_reason is FinishReason.ERROR:
                raise RuntimeError(f"synthesis failed: {output.error}")
            if output.finished:
                return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
