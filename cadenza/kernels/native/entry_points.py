"""The native kernels' one table: each library, the source it is built from (beside this
module) and every function it exports, with its ctypes signature.

The loader declares exactly these on every library it loads (argument types and result type,
:func:`cadenza.kernels.native.loader.load`); a wrapper asks the loader for a declared function
by name (:func:`~cadenza.kernels.native.loader.function`) and never declares one itself. An
entry point returns nothing unless its row says otherwise: it writes its results into the
buffers it is given. Pointers are ``c_void_p`` (a tensor's ``data_ptr()``); the comments name
the arguments in order, the sources state their shapes. A test checks this table against the
``extern "C"`` functions each source defines.
"""

from __future__ import annotations

from ctypes import c_float, c_int, c_int64, c_void_p
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EntryPoint:
    """An exported function: its name, argument types and result type (``None``: void)."""

    name: str
    argtypes: tuple[Any, ...]
    restype: Any = None


@dataclass(frozen=True)
class NativeLibrary:
    """A kernel library: ``name`` (what callers and reports call it), ``source`` (a file of
    this package; it may include the package's headers) and its ``entry_points``."""

    name: str
    source: str
    entry_points: tuple[EntryPoint, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(entry.name for entry in self.entry_points)


_P, _I, _I64, _F = c_void_p, c_int, c_int64, c_float

# Every library that includes cpu_product.h exports this (``request``: 1 on, 0 off, -1 ask).
_TILE_PRODUCTS = EntryPoint("cadenza_tile_products", (_I,), _I)

# shape, layers, num_layers, B, x, cos, signed_sin, slots, page_tables, max_pages, seq_lens,
# scratch
_DECODE_LAYERS = (_P, _P, _I, _I, _P, _P, _P, _P, _P, _I, _P, _P)
# x, B, T, lengths, K, H, w_ih, w_hh, bias, h, c, y
_LSTM_LAYER = (_P, _I, _I, _P, _I, _I, _P, _P, _P, _P, _P, _P)
# x, B, L, C, w, k, dilation, bias, out
_MONO_CONV = (_P, _I, _I, _I, _P, _I, _I, _F, _P)
# x, out, n, alpha
_ELU = (_P, _P, _I64, _F)

LIBRARIES: dict[str, NativeLibrary] = {
    library.name: library
    for library in (
        NativeLibrary(
            "cpu_bf16_linear",
            "cpu_bf16_linear.cpp",
            (
                EntryPoint(
                    "cadenza_bf16_linear", (_P, _I, _P, _I, _I, _P)
                ),  # x, B, packed, N, K, y
                EntryPoint("cadenza_bf16_linear_native", (), _I),
                _TILE_PRODUCTS,
            ),
        ),
        NativeLibrary(
            "cpu_decode_layers",
            "cpu_decode_layers.cpp",
            (
                EntryPoint("cadenza_decode_layers_f32", _DECODE_LAYERS),
                EntryPoint("cadenza_decode_layers_bf16", _DECODE_LAYERS),
                EntryPoint("cadenza_weight_pairs", (), _I),
                EntryPoint("cadenza_decode_scratch_bytes", (_P, _I, _I), _I64),  # shape, B, longest
                _TILE_PRODUCTS,
            ),
        ),
        NativeLibrary(
            "cpu_elu",
            "cpu_elu.cpp",
            (EntryPoint("cadenza_elu_f32", _ELU), EntryPoint("cadenza_elu_bf16", _ELU)),
        ),
        NativeLibrary(
            "cpu_lstm",
            "cpu_lstm.cpp",
            (
                EntryPoint("cadenza_lstm_layer_f32", _LSTM_LAYER),
                EntryPoint("cadenza_lstm_layer_bf16", _LSTM_LAYER),
                EntryPoint("cadenza_lstm_weight_pairs", (), _I),
                _TILE_PRODUCTS,
            ),
        ),
        NativeLibrary(
            "cpu_mono_conv",
            "cpu_mono_conv.cpp",
            (
                EntryPoint("cadenza_mono_conv_f32", _MONO_CONV),
                EntryPoint("cadenza_mono_conv_bf16", _MONO_CONV),
            ),
        ),
        NativeLibrary(
            "cpu_sampling",
            "cpu_sampling.cpp",
            (
                # logits, rows, vocab, per_row, temperature, top_k, min_p, uniform, ids
                EntryPoint("cadenza_draw_thresholded", (_P, _I64, _I64, _I64, _P, _P, _P, _P, _P)),
            ),
        ),
    )
}
