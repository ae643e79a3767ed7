"""Prepacked CPU linears: fp32 equals ``F.linear`` to rounding; bf16 is within bf16's rounding
of it; ``auto`` picks bf16 exactly where the CPU multiplies bf16 natively; on the native bf16
product (AVX512-BF16, AMX tiles where granted) a bf16 layer equals the product of its
bf16-rounded input and weight to float32 rounding, with the tiles or without; a build for a
level without bf16 products (``x86-64-v3``) is never used."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.cpu_linear import (
    NATIVE_LIBRARY,
    PackedLinear,
    bf16_packing_available,
    native_bf16_matmul,
    native_linear_library,
    pack_linears,
    packing_available,
    resolve_cpu_linear_dtype,
    tile_products,
)
from cadenza.kernels.native import loader

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu"), torch.float32), reason="no oneDNN packing"
)
needs_bf16_packing = pytest.mark.skipif(
    not bf16_packing_available(), reason="oneDNN packs no bf16 weights on this CPU"
)
needs_native = pytest.mark.skipif(
    native_linear_library() is None, reason="no native bf16 products on this CPU"
)


@pytest.mark.parametrize("rows", [1, 16, 33])
def test_fp32_packing_changes_nothing_but_rounding(rows: int) -> None:
    weight = torch.randn(96, 64)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(PackedLinear(weight)(x), F.linear(x, weight))


@needs_bf16_packing
@pytest.mark.parametrize("rows", [1, 16, 33])
def test_bf16_packing_is_within_bf16_rounding_and_returns_float32(rows: int) -> None:
    weight = torch.randn(96, 64)
    x = torch.randn(2, rows, 64)
    out = PackedLinear(weight, torch.bfloat16)(x)
    expected = F.linear(x, weight)
    assert out.dtype == torch.float32 and out.shape == expected.shape
    relative = (out - expected).norm() / expected.norm()
    assert relative < 1e-2  # bf16 keeps 8 bits of mantissa: about 0.4 % per rounding


@needs_bf16_packing
def test_pack_linears_swaps_bias_free_layers_only() -> None:
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8), nn.Linear(8, 4, bias=False))
    assert pack_linears(model, torch.bfloat16) == 2
    assert isinstance(model[0], PackedLinear) and model[0].compute_dtype == torch.bfloat16
    assert isinstance(model[1], nn.Linear)


def test_auto_is_bf16_exactly_where_the_cpu_has_native_bf16_units() -> None:
    expected = torch.bfloat16 if native_bf16_matmul() else torch.float32
    assert resolve_cpu_linear_dtype("auto") == expected
    assert resolve_cpu_linear_dtype("float32") == torch.float32
    if bf16_packing_available():
        assert resolve_cpu_linear_dtype("bfloat16") == torch.bfloat16


def test_bf16_asked_of_a_cpu_that_cannot_pack_it_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("cadenza.kernels.cpu_linear.bf16_packing_available", lambda: False)
    with pytest.raises(ValueError, match=r"cpu\.linear_dtype = 'bfloat16' needs a CPU"):
        resolve_cpu_linear_dtype("bfloat16")


@needs_bf16_packing
def test_a_kept_compute_dtype_is_the_float32_output_before_its_conversion() -> None:
    weight = torch.randn(512, 512)  # large enough for the packed product at 16 rows
    x = torch.randn(16, 512)
    converted = PackedLinear(weight, torch.bfloat16)
    kept = PackedLinear(weight, torch.bfloat16, keep_compute_dtype=True)
    out = kept(x)
    # the native product's output is float32 either way (its consumers promote anything)
    assert out.dtype == (torch.float32 if kept.pairs is not None else torch.bfloat16)
    assert torch.equal(out.float(), converted(x))
    # a product may take the compute dtype as its input, as from a kept output
    assert torch.equal(converted(x.bfloat16()), converted(x))


@needs_bf16_packing
def test_pack_linears_keeps_the_compute_dtype_where_a_module_lists_promoting_consumers() -> None:
    class Block(nn.Module):
        linears_with_promoting_consumers = ("into_residual",)

        def __init__(self) -> None:
            super().__init__()
            self.into_residual = nn.Linear(8, 8, bias=False)
            self.elsewhere = nn.Linear(8, 8, bias=False)

    model = nn.Sequential(Block())
    assert pack_linears(model, torch.bfloat16) == 2
    block = model[0]
    assert isinstance(block.into_residual, PackedLinear) and block.into_residual.keep_compute_dtype
    assert isinstance(block.elsewhere, PackedLinear) and not block.elsewhere.keep_compute_dtype


def _rounded_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What a bf16 product computes: bf16-rounded input and weight, float64 sums."""
    return (x.bfloat16().double() @ weight.bfloat16().double().T).float()


def test_the_native_product_is_used_exactly_where_its_build_multiplies_bf16(
    isa_level: str,
) -> None:
    build = loader.state(NATIVE_LIBRARY)
    assert build.loaded and build.level == isa_level
    multiplies_bf16 = build.isa in ("avx512bf16", "amx") and native_bf16_matmul()
    assert (native_linear_library() is not None) == multiplies_bf16


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 32, 40])
@pytest.mark.parametrize("out_features", [16, 48, 96])
def test_a_native_layer_is_the_rounded_product_at_every_row_count(
    rows: int, out_features: int, isa_level: str
) -> None:
    if native_linear_library() is None:
        pytest.skip(f"no native bf16 products in the {isa_level} build on this CPU")
    # 17, 40: a second group of rows (tiles hold 16); 16, 48: an odd number of output blocks
    weight = torch.randn(out_features, 64)
    layer = PackedLinear(weight, torch.bfloat16)
    assert layer.pairs is not None and layer.packed.numel() == 0  # no oneDNN copy
    x = torch.randn(rows, 64)
    torch.testing.assert_close(layer(x), _rounded_product(x, weight), rtol=1e-5, atol=1e-5)
    # one row's result does not depend on the rows beside it
    torch.testing.assert_close(layer(x[:1]), layer(x)[:1], rtol=0, atol=0)


@needs_native
def test_the_tile_product_and_the_dot_product_path_agree() -> None:
    library = native_linear_library()
    assert library is not None
    if not tile_products(library):
        pytest.skip("no AMX tiles on this CPU (or not granted)")
    weight = torch.randn(96, 128)
    layer = PackedLinear(weight, torch.bfloat16)
    x = torch.randn(7, 128)
    on = layer(x)
    try:
        assert not tile_products(library, enabled=False)
        off = layer(x)  # the same packed weight through the AVX512-BF16 dot products
    finally:
        assert tile_products(library, enabled=True)
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)


@needs_bf16_packing
def test_widths_the_native_product_does_not_take_stay_on_onednn() -> None:
    layer = PackedLinear(torch.randn(24, 64), torch.bfloat16)  # 24 outputs: not blocks of 16
    assert layer.pairs is None and layer.packed.numel() > 0


@needs_native
def test_without_tiles_a_large_layer_stays_on_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    library = native_linear_library()
    assert library is not None
    if tile_products(library):
        pytest.skip("AMX tiles take layers of every size")
    monkeypatch.setattr("cadenza.kernels.cpu_linear.NATIVE_DOT_MAX_WEIGHTS", 48 * 64)
    assert PackedLinear(torch.randn(48, 64), torch.bfloat16).pairs is not None
    large = PackedLinear(torch.randn(64, 64), torch.bfloat16)
    assert large.pairs is None and large.packed.numel() > 0


@needs_native
@pytest.mark.parametrize("out_features", [2051, 24, 4097])
def test_a_head_gives_float32_logits_at_any_width(out_features: int) -> None:
    """A head whose width is no multiple of the product's block (CSM's 2,051) is padded onto the
    native product: its logits are float32 sums, not rounded to bf16 (close logits don't tie)."""
    weight = torch.randn(out_features, 64)
    head = PackedLinear(weight, torch.bfloat16, gives_logits=True)
    assert head.pairs is not None
    x = torch.randn(5, 64)
    logits = head(x)
    assert logits.shape == (5, out_features) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, _rounded_product(x, weight), rtol=1e-5, atol=1e-5)
    assert (logits != logits.bfloat16().float()).any()  # not bf16 values


@needs_bf16_packing
def test_a_head_without_the_native_product_multiplies_in_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("cadenza.kernels.cpu_linear.native_linear_library", lambda: None)
    weight = torch.randn(2051, 64)
    head = PackedLinear(weight, torch.bfloat16, gives_logits=True)
    assert head.pairs is None and head.compute_dtype == torch.float32
    x = torch.randn(3, 64)
    torch.testing.assert_close(head(x), F.linear(x, weight))


def test_pack_linears_marks_the_heads_a_module_lists() -> None:
    class Tiny(nn.Module):
        linears_giving_logits = ("lm_head", "heads")

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(64, 64, bias=False)
            self.lm_head = nn.Linear(64, 40, bias=False)
            self.heads = nn.ModuleList([nn.Linear(64, 24, bias=False) for _ in range(2)])

    model = Tiny()
    assert pack_linears(model, torch.float32) == 4
    assert not model.proj.gives_logits
    assert model.lm_head.gives_logits and all(head.gives_logits for head in model.heads)
