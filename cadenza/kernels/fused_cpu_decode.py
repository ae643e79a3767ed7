"""A Llama decoder stack's steps on the CPU in one native call per step.

On the CPU a small model's decode step costs what its torch ops cost to launch, not their
arithmetic: cadenza-tiny's layer is ~30 ops, 0.5-0.8 ms for one row, for products whose
weights stream from cache in tens of microseconds. :class:`FusedCpuDecode` runs every layer of
a step through the kernel in ``native/cpu_decode_layers.cpp`` (:mod:`~cadenza.kernels.native.loader`
builds it): same math as the torch path (RMSNorm, fused q/k/v, rotary, paged KV store,
grouped-query attention over the pages in place, SwiGLU), float32 activations and
accumulation, weights float32 or bfloat16 (on a CPU with AVX512-BF16 dot products, bf16
products round their inputs to bf16 as oneDNN's do, :attr:`FusedCpuDecode.rounds_activations`).
Every token is a row: a decode token attends its
whole sequence, a prefill chunk's token the positions up to its own (:func:`token_rows`), so
decodes and prefill chunks share the call, and no row pays for another's context.
docs/journal/2026-12-02-fused-cpu-step.md has the speed and the accuracy against the torch path
(current figures: docs/benchmarks.md, "CPU kernels and precision").

What it needs, else the step stays on torch (:meth:`FusedCpuDecode.applies`): float32
activations on the CPU, a float32 or bfloat16 KV cache, no dense decode copy, and widths the kernel
handles (multiples of 16, head width at most 128); weights in plain ``nn.Linear`` or
:class:`~cadenza.kernels.cpu_linear.PackedLinear` layers (not int8).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.attention_context import AttentionContext
from cadenza.kernels.cpu_linear import PackedLinear
from cadenza.kernels.native import loader
from cadenza.kernels.packed_product import pack_weight

if TYPE_CHECKING:
    from cadenza.kernels.fusable_decoder import FusableDecoder, PagedCache

LIBRARY = "cpu_decode_layers"
LANES = 16  # widths the kernel takes are multiples of this
MAX_HEAD_DIM = 128
MAX_GROUP = 64
CACHE_DTYPES = (torch.float32, torch.bfloat16)


class _Shape(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("intermediate", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("cache_bf16", ctypes.c_int32),
    ]


class _LayerWeights(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "qkv",
            "o",
            "gate_up",
            "down",
            "input_norm",
            "post_attention_norm",
            "keys",
            "values",
        )
    ]


def _projections(layer: nn.Module) -> tuple[nn.Module | None, ...]:
    """A decoder layer's fused q/k/v, output, fused gate/up and down projections."""
    attention, mlp = getattr(layer, "self_attn"), getattr(layer, "mlp")  # noqa: B009
    return (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)


def _norm_weights(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's two RMSNorm weights, float32, contiguous."""
    return tuple(
        getattr(layer, name).weight.detach().float().contiguous()
        for name in ("input_layernorm", "post_attention_layernorm")
    )


def _plain_weight(module: nn.Module | None) -> torch.Tensor | None:
    if isinstance(module, PackedLinear | nn.Linear) and getattr(module, "bias", None) is None:
        return module.weight
    return None


def unsupported_reason(backbone: FusableDecoder) -> str | None:
    """Why the kernel cannot run ``backbone`` (``None``: it can)."""
    config = backbone.config
    widths = {
        "hidden size": config.hidden_size,
        "head width": config.head_dim,
        "intermediate size": config.intermediate_size,
    }
    for name, width in widths.items():
        if width % LANES:
            return f"{name} {width} is not a multiple of {LANES}"
    if config.head_dim > MAX_HEAD_DIM:
        return f"head width {config.head_dim} is over {MAX_HEAD_DIM}"
    if config.num_heads // config.num_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads share a key head"
    for layer in backbone.layers:
        for module in _projections(layer):
            weight = _plain_weight(module)
            if weight is None:
                return "its projections are not fused plain linear layers (int8 weights?)"
            if weight.device.type != "cpu" or weight.dtype != torch.float32:
                return "its weights are not float32 on the CPU"
    return None


def token_rows(context: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token of the step as the kernel's row: its sequence's page table (``[N,
    max_pages]`` int32, -1 padded) and the positions it attends, its own included (``[N]``
    int32). A decode token attends its whole sequence; prefill token ``j`` of a chunk the
    positions up to its own (causal: the chunk's keys are stored before any row attends)."""
    if not context.prefills:
        return (
            context.decode_page_tables.to(torch.int32).contiguous(),
            context.decode_seq_lens.to(torch.int32).contiguous(),
        )
    width = max(
        [context.decode_page_tables.shape[1], *(len(s.page_table) for s in context.prefills)]
    )
    tables = [F.pad(context.decode_page_tables.to(torch.int32),
                    (0, width - context.decode_page_tables.shape[1]), value=-1)]  # fmt: skip
    lengths = [context.decode_seq_lens.to(torch.int32)]
    for span in context.prefills:
        table = F.pad(span.page_table.to(torch.int32), (0, width - len(span.page_table)), value=-1)
        tables.append(table.expand(span.query_len, width))
        first = span.context_len - span.query_len + 1
        lengths.append(torch.arange(first, span.context_len + 1, dtype=torch.int32))
    return torch.cat(tables).contiguous(), torch.cat(lengths).contiguous()


class FusedCpuDecode:
    """The kernel's weights for one backbone (packed once) and the call for one step."""

    def __init__(
        self, backbone: FusableDecoder, weight_dtype: torch.dtype, library: ctypes.CDLL
    ) -> None:
        if weight_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"the fused CPU decode multiplies float32 or bfloat16, not {weight_dtype}"
            )
        config = backbone.config
        self.weight_dtype = weight_dtype
        self.num_layers = config.num_layers
        self.hidden_size = config.hidden_size
        self.shape = _Shape(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            0,
            config.rms_norm_eps,
            config.head_dim**-0.5,
            0,
        )
        # bfloat16 weights go in pairs along k where the CPU multiplies them so.
        pairs = weight_dtype == torch.bfloat16 and bool(library.cadenza_weight_pairs())
        self.rounds_activations = pairs  # the products' inputs are rounded to bf16 too
        self._tensors: list[torch.Tensor] = []  # what the pointers below point into
        self._weights: list[tuple[int, ...]] = []
        for layer in backbone.layers:
            pointers = []
            for module in _projections(layer):
                weight = _plain_weight(module)
                assert weight is not None
                packed = pack_weight(weight, weight_dtype, pairs)
                self._tensors.append(packed)
                pointers.append(packed.data_ptr())
            for norm_weight in _norm_weights(layer):
                self._tensors.append(norm_weight)
                pointers.append(norm_weight.data_ptr())
            self._weights.append(tuple(pointers))
        self._layers_for: dict[tuple[object, ...], ctypes.Array[_LayerWeights]] = {}
        self._scratch = torch.empty(0, dtype=torch.uint8)
        self._run = (
            library.cadenza_decode_layers_bf16
            if weight_dtype == torch.bfloat16
            else library.cadenza_decode_layers_f32
        )
        self._scratch_bytes = library.cadenza_decode_scratch_bytes

    @classmethod
    def build(cls, backbone: FusableDecoder, weight_dtype: torch.dtype) -> FusedCpuDecode | None:
        """The fused decode for ``backbone``, or ``None`` when the kernel cannot run it or
        cannot be built on this machine."""
        if unsupported_reason(backbone) is not None:
            return None
        library = loader.load(LIBRARY)
        if library is None:
            return None
        return cls(backbone, weight_dtype, library)

    @property
    def nbytes(self) -> int:
        """Memory the packed weights take."""
        return sum(t.nbytes for t in self._tensors)

    @staticmethod
    def supports_cache(kv_cache: PagedCache) -> bool:
        return kv_cache.dtype in CACHE_DTYPES and kv_cache.keys.device.type == "cpu"

    def applies(
        self, embeddings: torch.Tensor, context: AttentionContext, kv_cache: PagedCache
    ) -> bool:
        """Whether this step can run fused: float32 on the CPU, a float32 or bfloat16 cache,
        no dense decode copy."""
        return (
            context.dense_decode is None
            and embeddings.shape[0] > 0
            and embeddings.dtype == torch.float32
            and embeddings.device.type == "cpu"
            and self.supports_cache(kv_cache)
        )

    def __call__(
        self,
        embeddings: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        context: AttentionContext,
        kv_cache: PagedCache,
    ) -> torch.Tensor:
        """Hidden states after every layer (before the final norm), ``[N, hidden]``, for the
        step's ``N`` tokens; stores their keys and values in ``kv_cache``. Call only where
        :meth:`applies`."""
        batch = embeddings.shape[0]
        x = embeddings.reshape(batch, self.hidden_size).contiguous().clone()
        cos = rotary[0].reshape(batch, -1).contiguous()
        signed_sin = rotary[1].reshape(batch, -1).contiguous()
        slots = context.slot_mapping.contiguous()
        tables, lengths = token_rows(context)
        longest = int(lengths.max())
        shape = self.shape
        shape.page_size = kv_cache.page_size
        shape.cache_bf16 = int(kv_cache.dtype == torch.bfloat16)
        shape_pointer = ctypes.cast(ctypes.pointer(shape), ctypes.c_void_p)
        needed = int(self._scratch_bytes(shape_pointer, batch, longest))
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(2 * needed, dtype=torch.uint8)
        self._run(
            shape_pointer,
            ctypes.cast(self._layers(kv_cache), ctypes.c_void_p),
            self.num_layers,
            batch,
            ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(cos.data_ptr()),
            ctypes.c_void_p(signed_sin.data_ptr()),
            ctypes.c_void_p(slots.data_ptr()),
            ctypes.c_void_p(tables.data_ptr()),
            tables.shape[1],
            ctypes.c_void_p(lengths.data_ptr()),
            ctypes.c_void_p(self._scratch.data_ptr()),
        )
        return x

    def _layers(self, kv_cache: PagedCache) -> ctypes.Array[_LayerWeights]:
        """The per-layer pointer table for ``kv_cache`` (built once per cache)."""
        key = (kv_cache.keys.data_ptr(), kv_cache.values.data_ptr(), *kv_cache.keys.shape)
        table = self._layers_for.get(key)
        if table is None:
            if len(self._layers_for) > 8:
                self._layers_for.clear()
            table = (_LayerWeights * self.num_layers)()
            for index, pointers in enumerate(self._weights):
                keys, values = kv_cache.layer(index)
                assert keys.is_contiguous() and values.is_contiguous()
                table[index] = _LayerWeights(*pointers, keys.data_ptr(), values.data_ptr())
            self._layers_for[key] = table
        return table
