"""Per-stream model state: what a stateful model (an encoder-decoder, a guided model) keeps
for each stream beside its paged KV, what it is made from, and how a step hands it over.

The model makes a stream's :class:`StreamState` once, when the stream first runs
(:meth:`AudioTokenModel.begin_stream <cadenza.engine.models.model.AudioTokenModel.begin_stream>`
from its :class:`StreamConditioning`); the sequence holds it until it ends. Its memory is a KV
class of its own: the engine sets aside ``state_bytes_per_stream`` for each stream it runs at
once (fewer streams than ``engine.max_num_seqs`` where their state would take over half the KV
budget: :func:`cadenza.engine.builder.streams_with_state`) before it sizes the paged cache,
and ``cadenza plan`` prints both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cadenza.contract.sampling import SamplingParams


class StreamState(Protocol):
    """What a stateful model keeps for one stream beside its paged KV (an encoder's output,
    cross-attention keys and values, the stream's guidance scale): made once by
    :meth:`AudioTokenModel.begin_stream` when the stream first runs, dropped with the stream.
    ``nbytes``: the memory it holds (at most :attr:`AudioTokenModel.state_bytes_per_stream`)."""

    nbytes: int


@dataclass(frozen=True)
class StreamConditioning:
    """What a stream asks a stateful model to condition on: its text, voice and sampling, and
    what its prompt holds before the text (a model that takes context, such as Dia cloning a
    voice): ``context_texts``, the conversation turns' transcripts, oldest first (an encoder
    reads them ahead of the text); ``context_frames``, the audio of the turns and of the
    speech prompt, in the order the prompt holds it, as codec frames (``[frames][codebooks]``;
    a delay pattern's late codebooks still emit the last ones after the prompt). Both empty
    without context or speech prompt."""

    text: str
    voice: str
    sampling: SamplingParams
    context_texts: tuple[str, ...] = ()
    context_frames: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class StepStreams:
    """A step's streams, for a stateful model's ``forward``: each sequence's state, in the
    order of the step's flattened tokens (its decodes, one token each, then its prefill
    chunks), and how many of the step's tokens each has."""

    states: tuple[StreamState, ...]
    token_counts: tuple[int, ...]
