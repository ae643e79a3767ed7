"""One record per model family: how its checkpoints are recognised and loaded, the shape of its
paged KV cache from the config alone, and what it can do. The registry
(:mod:`~cadenza.engine.models.registry`) holds the table; nothing else in the engine imports a
family. Layout, prompt format, voices and sampling defaults come from the family's ``load``
(they depend on the checkpoint's files) and are read from the model it returns; the flags
below say what every model of the family has, and a test holds each loaded model to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from cadenza.engine.models.model import AudioTokenModel

ConfigJson = dict[str, Any]
"""A checkpoint's ``config.json``, parsed."""


class PagedShape(Protocol):
    """The shape of a model's paged self-attention KV (a Llama backbone's config is one):
    what ``cadenza plan`` prices per token."""

    @property
    def num_layers(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def num_heads(self) -> int: ...


@dataclass(frozen=True)
class PagedLayers:
    """A :class:`PagedShape` by its numbers, for a family whose paged KV is not one Llama
    backbone's (a guided model's: both branches' layers)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_heads: int


@dataclass(frozen=True)
class ModelFamily:
    """``recognises(directory, config)``: whether a checkpoint is this family's (the registry
    asks families in table order, the first that says yes loads it); ``load(directory,
    config, device, dtype)``: the model, weights loaded (raises ``CheckpointError`` with the
    reason); ``paged_backbone(directory, config)``: the shape of the KV that is paged (every
    layer that stores it, a guided model's unconditional branch included), without reading
    weights (``cadenza plan``); ``stream_state(directory, config, dtype)``: the most bytes one
    stream's per-stream state holds (an encoder-decoder's cross-attention KV; ``None``: no
    such state), the second KV class ``cadenza plan`` prints. Capabilities: ``depth_decoder`` (a
    two-level model), ``takes_context`` (prompts from earlier turns), ``fused_cpu_step`` (its
    backbone runs on the fused native CPU step where the shape fits), ``restricted_outputs``
    (its heads compute only the ids a row position may emit, when it speaks)."""

    name: str
    summary: str
    recognises: Callable[[Path, ConfigJson], bool]
    load: Callable[[Path, ConfigJson, torch.device, torch.dtype], AudioTokenModel]
    paged_backbone: Callable[[Path, ConfigJson], PagedShape]
    stream_state: Callable[[Path, ConfigJson, torch.dtype], int] | None = None
    depth_decoder: bool = False
    takes_context: bool = False
    fused_cpu_step: bool = True
    restricted_outputs: bool = False
