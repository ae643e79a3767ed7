"""Linear layers with weights prepacked for oneDNN, the fast path for fp32 on the CPU.

A plain ``F.linear`` on the CPU goes through MKL with the weight in its checkpoint layout; for
the small row counts of a decode step (1-64 tokens) that reaches a fraction of the machine's
bandwidth. Reordering the weight once into oneDNN's blocked layout (what ``torch.compile``
does on CPU) makes the same product 2-4x faster at batch 1-16 on the development machine
(docs/journal/2026-11-29-first-measurements.md). :func:`pack_linears` swaps every bias-free
``nn.Linear`` of a model for :class:`PackedLinear`; outputs agree with ``F.linear`` to float
rounding.

On a CPU with native bf16 matrix units (AMX tiles or AVX512-BF16,
:func:`native_bf16_matmul`), the packed weight can be bf16 instead: the product then runs on
those units, 2.5-4x faster again at 16-32 rows, with bf16's rounding of weights and
activations (the input is rounded to bf16, accumulation and the output stay fp32). What that
costs in accuracy is measured in
docs/journal/2026-12-01-on-time-guarantee-honest-capacity-cpu-precision.md ("CPU precision";
current figures: docs/benchmarks.md, "CPU kernels and precision").

Where the CPU multiplies bf16 in hardware (AVX512-BF16, or AMX tiles the kernel grants) and
the C++ compiler is there (:func:`native_linear_library`), a bf16 layer whose widths fit
(outputs a multiple of 16, inputs of 32; without tiles, only a layer of at most
:data:`NATIVE_DOT_MAX_WEIGHTS` weights) skips oneDNN: its weight is pair-packed once and every
product, one row or many, runs through cadenza's own product (``cpu_bf16_linear.cpp``, the one
the fused decode step uses), with float32 sums and a float32 output. oneDNN's fixed cost per
call and its bf16 output go: a 256 x 8208 output head at 1-16 rows took 0.23-0.26 ms instead
of 0.5-1.1 on AMX tiles, 0.07-0.35 ms instead of 0.12-0.42 on AVX512-BF16; larger layers at
many rows are within 10 % of oneDNN on tiles (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.linear_swap import swap_linears
from cadenza.kernels.native import loader
from cadenza.kernels.packed_product import pack_weight

NATIVE_LIBRARY = "cpu_bf16_linear"
NATIVE_WIDTHS = (16, 32)  # outputs and inputs must be multiples of these for the native product
# Without AMX tiles, the native product's dot products beat oneDNN's at every row count for
# layers up to about this many weights (a 256 x 8208 head: 1.2-1.8x at 1-16 rows, 0.97x at 200),
# and lose to its cache blocking on larger ones at tens of rows (8192 x 3072 at 16 rows: 0.81x);
# larger layers stay on oneDNN there
# (docs/journal/2026-12-03-audio-way-out-and-native-bf16-linears.md).
NATIVE_DOT_MAX_WEIGHTS = 4 << 20


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16), where oneDNN's
    bf16 products beat fp32 ones; without them bf16 is emulated and slower."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


@functools.cache
def bf16_packing_available() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU at all (it needs AVX512 BW, VL and DQ, or
    AVX-NE-CONVERT; an AVX2-only CPU has neither)."""
    if not packing_available(torch.device("cpu"), torch.float32):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def resolve_cpu_linear_dtype(setting: str) -> torch.dtype:
    """``cpu.linear_dtype`` as a dtype: ``auto`` is bf16 where
    :func:`native_bf16_matmul`, else fp32. Raises ``ValueError`` for ``bfloat16`` on a CPU
    whose oneDNN cannot pack bf16 weights (:func:`bf16_packing_available`)."""
    if setting == "auto":
        return torch.bfloat16 if native_bf16_matmul() else torch.float32
    if setting == "bfloat16" and not bf16_packing_available():
        raise ValueError(
            "cpu.linear_dtype = 'bfloat16' needs a CPU with AVX512 (BW, VL, DQ) or "
            "AVX-NE-CONVERT for oneDNN's bf16 products; this one has neither: use 'auto' or "
            "'float32'"
        )
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[setting]


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to fp32 weights on a CPU build that has the ops."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def amx_available() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later)."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


@functools.cache
def native_linear_library() -> ctypes.CDLL | None:
    """The native bf16 product (``cpu_bf16_linear.cpp``), or ``None`` where it would not
    multiply bf16 in hardware (no AVX512-BF16; no compiler)."""
    if not native_bf16_matmul():
        return None
    library = loader.load(NATIVE_LIBRARY)
    if library is None or not library.cadenza_bf16_linear_native():
        return None
    return library


def tile_products(library: ctypes.CDLL, enabled: bool | None = None) -> bool:
    """Whether ``library`` (any native kernel library: they all include ``cpu_product.h``)
    runs its bf16 products on AMX tiles; ``enabled`` turns them off or back on first (the
    side-by-side benchmarks do; serving leaves them as the machine allows)."""
    return bool(library.cadenza_tile_products(-1 if enabled is None else int(enabled)))


# On a CPU with AMX tiles a oneDNN call cost 30-40 us however small the product (2 cores), and
# below about this many multiply-adds plain ``F.linear`` (MKL, fp32) was as fast or faster. On
# one without (AVX512-BF16 only: AMD EPYC), packed products won at every size once a step's
# weights no longer sat in cache, 1.1-1.5x over the whole step at 1-4 streams, so nothing is
# routed around them there (both machines:
# docs/journal/2026-12-01-on-time-guarantee-honest-capacity-cpu-precision.md and
# docs/journal/2026-12-01-dense-decode-copy.md).
AMX_SMALL_PRODUCT_MACS = 2_500_000
SMALL_PRODUCT_MACS = AMX_SMALL_PRODUCT_MACS if amx_available() else 0


class PackedLinear(nn.Module):
    """``y = x @ weight.T`` with ``weight`` kept for reference and a packed copy for compute,
    in ``compute_dtype`` (fp32, or bf16 for the CPU's bf16 units). Input fp32 (or already in
    ``compute_dtype``); output fp32, or left in ``compute_dtype`` when ``keep_compute_dtype``
    (for consumers that promote it themselves, saving a conversion of every output).

    Products smaller than :data:`SMALL_PRODUCT_MACS` (few rows through a small layer; only on
    CPUs with AMX) use the fp32 ``weight`` directly: oneDNN's fixed cost per call would
    dominate them. With bf16 that makes a row's result depend, to bf16 rounding, on how many
    rows share the call. A bf16 layer on the native product (see the module) has neither: one
    path for every row count, its output always fp32 (which every consumer takes)."""

    packed: torch.Tensor
    pairs: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
        keep_compute_dtype: bool = False,
        gives_logits: bool = False,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.keep_compute_dtype = keep_compute_dtype and not gives_logits
        self.gives_logits = gives_logits
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.padded_out_features = self.out_features
        native = compute_dtype == torch.bfloat16 and self._native_fits()
        if native and gives_logits:
            # A head's logits must not come back rounded to bf16 (close logits would tie, and
            # sampling probabilities be quantised): it takes the native product, whose sums
            # and output are float32, its width padded with zero rows to the product's block.
            self.padded_out_features = -(-self.out_features // NATIVE_WIDTHS[0]) * NATIVE_WIDTHS[0]
        elif gives_logits and compute_dtype == torch.bfloat16:
            compute_dtype = torch.float32  # no native product here: the head stays float32
        if native and self.padded_out_features % NATIVE_WIDTHS[0] == 0:
            padded = F.pad(
                self.weight.detach(), (0, 0, 0, self.padded_out_features - self.out_features)
            )
            self.register_buffer(
                "pairs", pack_weight(padded, torch.bfloat16, pairs=True), persistent=False
            )
            self.register_buffer("packed", torch.empty(0), persistent=False)
        else:
            self.pairs = None
            self.register_buffer(
                "packed",
                torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().to(compute_dtype)),
                persistent=False,
            )
        self.compute_dtype = compute_dtype

    def _native_fits(self) -> bool:
        """Whether this bf16 layer can run on the native product (see :data:`NATIVE_WIDTHS`,
        :data:`NATIVE_DOT_MAX_WEIGHTS`): its inputs a multiple of the product's width, and its
        outputs too unless it gives logits (a head is padded, and takes the native product at
        any size: float32 logits come first)."""
        if self.in_features % NATIVE_WIDTHS[1]:
            return False
        if not self.gives_logits and self.out_features % NATIVE_WIDTHS[0]:
            return False
        library = native_linear_library()
        if library is None:
            return False
        small = self.out_features * self.in_features <= NATIVE_DOT_MAX_WEIGHTS
        return small or self.gives_logits or tile_products(library)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype not in (torch.float32, self.compute_dtype):
            return F.linear(x, self.weight)
        if self.pairs is not None:
            return self._native_forward(x)
        rows = x.numel() // self.in_features
        if rows * self.in_features * self.out_features < SMALL_PRODUCT_MACS:
            return F.linear(x.float(), self.weight)
        flat = x.reshape(-1, self.in_features).to(self.compute_dtype)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "")
        if not self.keep_compute_dtype:
            out = out.to(torch.float32)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _native_forward(self, x: torch.Tensor) -> torch.Tensor:
        library = native_linear_library()
        assert self.pairs is not None and library is not None
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.empty(flat.shape[0], self.padded_out_features)
        if flat.shape[0]:
            library.cadenza_bf16_linear(
                flat.data_ptr(),
                flat.shape[0],
                self.pairs.data_ptr(),
                self.padded_out_features,
                self.in_features,
                out.data_ptr(),
            )
        if self.padded_out_features != self.out_features:
            out = out[:, : self.out_features]
        return out.reshape(*x.shape[:-1], self.out_features)


# A module may list, in this attribute, the names of its linear layers whose outputs only feed
# ops that promote them to fp32 themselves (residual adds, rotary, the KV store, another packed
# product): those keep the compute dtype (:attr:`PackedLinear.keep_compute_dtype`).
PROMOTING_CONSUMERS = "linears_with_promoting_consumers"
# A module lists here the names of its output heads (a linear layer, or a list of them): their
# outputs are logits, float32 whatever the products run in (:attr:`PackedLinear.gives_logits`).
LOGIT_HEADS = "linears_giving_logits"


def pack_linears(module: nn.Module, compute_dtype: torch.dtype = torch.float32) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` in place; returns how many. The
    ones a module lists in :data:`PROMOTING_CONSUMERS` keep the compute dtype; the heads it
    lists in :data:`LOGIT_HEADS` give float32 logits."""
    heads = {id(linear) for linear in logit_heads(module)}

    def pack(weight: torch.Tensor) -> PackedLinear:
        return PackedLinear(weight, compute_dtype, gives_logits=id(weight) in heads)

    count = swap_linears(module, pack)
    for parent in module.modules():
        for name in getattr(parent, PROMOTING_CONSUMERS, ()):
            child = getattr(parent, name, None)
            if isinstance(child, PackedLinear):
                child.keep_compute_dtype = True
    return count


def logit_heads(module: nn.Module) -> list[torch.Tensor]:
    """The weights of the output heads every module under ``module`` lists in
    :data:`LOGIT_HEADS` (a tied head shares its embedding's weight: it is still a head)."""
    weights = []
    for parent in module.modules():
        for name in getattr(parent, LOGIT_HEADS, ()):
            child = getattr(parent, name, None)
            layers = child if isinstance(child, nn.ModuleList) else [child]
            weights += [layer.weight for layer in layers if isinstance(layer, nn.Linear)]
    return weights
