"""Decode steps at fixed shapes, replayed as CUDA graphs where the device has them.

A step of ``n`` decodes (no prefill chunk) runs at the smallest batch size of
:func:`~cadenza.engine.decode_buckets.decode_bucket_sizes` that holds it. Every input lives in
a static buffer of the largest size (token rows, positions, cache slots, sequence lengths and
page tables ``[max_batch, max_pages]``), and the step reads views of their first ``size`` rows:
the same tensors at the same addresses every time, which is what a captured graph replays.

Rows past ``n`` are padding. Each writes its key and value to the cache's pad page
(:attr:`PagedKVCache.pad_page`, never handed out) and attends to that one slot: it reads no
sequence's KV and writes nowhere a sequence reads, and its outputs are dropped. A decode row's
result does not depend on the rows beside it, so a padded step's real rows are the unpadded
step's (tested exactly on the CPU).

Host to device: the rows are written on the host into staging buffers (pinned on CUDA) and
copied without blocking; only the page-table columns in use this step are copied (the
columns past a sequence's own pages are never read: its length bounds every read). Before the
staging buffers are written again the host waits for the last step's copies (an event: in
the engine long done, since the step's ids came back to the host in between).

On CUDA (:meth:`StaticDecodeStep.capture`) each size is captured once as a CUDA graph, largest
first, sharing one memory pool, and a step is one replay. Elsewhere the step runs eagerly on
the same buffers (the CPU gains nothing from padding: the runner uses this there only when
asked, to check the shapes). Nothing inside the step reads the device: it traces as one graph
under ``torch.compile(fullgraph=True)`` (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cadenza.engine.decode_buckets import bucket_for, decode_bucket_sizes
from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.sequence import Sequence
from cadenza.kernels.attention_context import AttentionContext, decode_keys

DecodeForward = Callable[
    [torch.Tensor, torch.Tensor, AttentionContext, PagedKVCache, torch.Tensor], torch.Tensor
]
"""A model's forward (``input_ids, positions, context, kv_cache, logits_indices`` -> one output
row per index): what the step runs, and a graph captures."""

WARMUP_STEPS = 2
"""Eager steps at a size before its capture (kernels compiled, allocator settled)."""


class StaticDecodeStep:
    """Pure decode steps of up to ``max_batch`` sequences at fixed shapes over ``kv_cache``
    (which must have a pad page). ``forward``: the model's forward the step runs;
    ``num_codebooks``: ids a token row holds; ``max_pages``: the most pages a sequence's page
    table may have (the page tables' fixed width); ``gathers_keys``: the attention backend
    reads :class:`~cadenza.kernels.attention_context.DecodeKeys` (the torch path), which the
    step then derives at the full width."""

    def __init__(
        self,
        forward: DecodeForward,
        kv_cache: PagedKVCache,
        *,
        num_codebooks: int,
        max_batch: int,
        max_pages: int,
        gathers_keys: bool,
        device: torch.device,
    ) -> None:
        if kv_cache.pad_page is None:
            raise ValueError("a fixed-shape decode step needs a KV cache with a pad page")
        if max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, got {max_pages}")
        self.forward = forward
        self.kv_cache = kv_cache
        self.sizes = decode_bucket_sizes(max_batch)
        self.max_pages = max_pages
        self.gathers_keys = gathers_keys
        self.device = device
        self.page_size = kv_cache.page_size
        self.pad_page = kv_cache.pad_page
        rows, pinned = self.sizes[-1], device.type == "cuda"

        def staging(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=pinned)

        def static(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self._host = {
            "ids": staging((rows, num_codebooks), torch.long),
            "positions": staging((rows,), torch.long),
            "slots": staging((rows,), torch.long),
            "lens": staging((rows,), torch.int32),
            # Contiguous for any width in use: a step's [size, width] is its first elements.
            "tables": staging((rows * max_pages,), torch.int32),
        }
        # Numpy views of the staging buffers, made once (the step fills them row by row).
        self._staged = {name: tensor.numpy() for name, tensor in self._host.items()}
        self._ids = static((rows, num_codebooks), torch.long)
        self._positions = static((rows,), torch.long)
        self._slots = static((rows,), torch.long)
        self._lens = static((rows,), torch.int32)
        self._tables = torch.full((rows, max_pages), -1, dtype=torch.int32, device=device)
        self._indices = torch.arange(rows, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._copied: torch.cuda.Event | None = None  # the last upload's copies, on CUDA

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    @property
    def graphed(self) -> bool:
        """Whether steps replay captured graphs (:meth:`capture`)."""
        return bool(self._graphs)

    def takes(self, num_decodes: int) -> bool:
        """Whether a step of ``num_decodes`` decodes fits a size."""
        return 0 < num_decodes <= self.max_batch

    def run(self, decodes: list[Sequence]) -> torch.Tensor:
        """The forward's output rows of ``decodes`` (each at its next position, its page
        table covering it), in order: a view of the step's static output, valid until the
        next step. ``ValueError`` for more decodes than the largest size, or a page table
        wider than ``max_pages``."""
        size = bucket_for(self.sizes, len(decodes))
        width = self._stage(decodes, size)
        self._upload(size, width)
        captured = self._graphs.get(size)
        if captured is None:
            out = self.forward_at(size)
        else:
            graph, out = captured
            graph.replay()
        return out[: len(decodes)]

    def eager(self, decodes: list[Sequence]) -> torch.Tensor:
        """As :meth:`run`, never through a graph (to time one against the other)."""
        size = bucket_for(self.sizes, len(decodes))
        self._upload(size, self._stage(decodes, size))
        return self.forward_at(size)[: len(decodes)]

    @torch.inference_mode()
    def capture(self) -> int:
        """Capture every size as a CUDA graph, largest first, in one memory pool; returns the
        device memory the graphs took (bytes). ``ValueError`` off CUDA."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        before = torch.cuda.memory_reserved(self.device)
        pool = None
        for size in reversed(self.sizes):
            self._upload(size, self._stage([], size))
            for _ in range(WARMUP_STEPS):
                self.forward_at(size)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.forward_at(size)
            pool = graph.pool()
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_reserved(self.device) - before

    def forget_graphs(self) -> None:
        """Drop every captured graph: steps run eagerly again."""
        self._graphs.clear()

    def _stage(self, decodes: list[Sequence], size: int) -> int:
        """Write the rows of ``decodes`` and ``size - len(decodes)`` padding rows into the
        staging buffers; returns the page-table width in use."""
        if self._copied is not None:
            self._copied.synchronize()  # the staging buffers' last copies are done
        staged = self._staged
        ids, positions, slots, lens = (staged[k] for k in ("ids", "positions", "slots", "lens"))
        page = self.page_size
        width = max((len(seq.page_table) for seq in decodes), default=1)
        if width > self.max_pages:
            raise ValueError(f"a page table of {width} pages exceeds {self.max_pages}")
        tables = staged["tables"][: size * width].reshape(size, width)
        for i, seq in enumerate(decodes):
            position = seq.num_computed_tokens
            table = seq.page_table
            ids[i] = seq.token_rows[position]
            positions[i] = position
            slots[i] = table[position // page] * page + position % page
            lens[i] = position + 1
            tables[i, : len(table)] = table
        pad = slice(len(decodes), size)
        ids[pad] = 0
        positions[pad] = 0
        slots[pad] = self.pad_page * page
        lens[pad] = 1
        tables[pad, 0] = self.pad_page
        return width

    def _upload(self, size: int, width: int) -> None:
        """Copy the staged rows of a step of ``size`` into the static buffers."""
        host = self._host
        self._ids[:size].copy_(host["ids"][:size], non_blocking=True)
        self._positions[:size].copy_(host["positions"][:size], non_blocking=True)
        self._slots[:size].copy_(host["slots"][:size], non_blocking=True)
        self._lens[:size].copy_(host["lens"][:size], non_blocking=True)
        tables = host["tables"][: size * width].view(size, width)
        self._tables[:size, :width].copy_(tables, non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._copied.record()

    def forward_at(self, size: int) -> torch.Tensor:
        """The forward over the static buffers' first ``size`` rows (what a graph captures)."""
        tables, lens = self._tables[:size], self._lens[:size]
        keys = None
        if self.gathers_keys:
            keys = decode_keys(
                tables,
                lens,
                self.page_size,
                self.kv_cache.spec.num_kv_heads,
                max_len=self.max_pages * self.page_size,
            )
        context = AttentionContext(
            slot_mapping=self._slots[:size],
            num_decodes=size,
            decode_page_tables=tables,
            decode_seq_lens=lens,
            prefills=(),
            decode_keys=keys,
            every_slot_set=True,
        )
        return self.forward(
            self._ids[:size], self._positions[:size], context, self.kv_cache, self._indices[:size]
        )


def uses_fixed_decode_shapes(
    model: AudioTokenModel, device: torch.device, cuda_graphs: bool
) -> bool:
    """Whether ``model``'s engine on ``device`` runs its decode steps at fixed shapes: on CUDA
    with ``engine.cuda_graphs``, for a model without per-stream state (whose step's inputs
    are more than rows and positions)."""
    return cuda_graphs and device.type == "cuda" and not model.keeps_stream_state


def fixed_decode_width(kv_cache_pages: int, page_size: int, max_positions: int | None) -> int:
    """The page tables' fixed width: the pages of the model's longest context, at most every
    page of the pool."""
    if max_positions is None:
        return kv_cache_pages
    return max(1, min(kv_cache_pages, -(-max_positions // page_size)))
