"""Precision: a dtype the user names is the dtype of the math; ``auto`` lowers only where the
CPU multiplies bf16 natively, and every lowering is listed and said."""

from __future__ import annotations

import torch

from cadenza.contract.precision import Precision
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel
from cadenza.engine.precision import precision_of, products_dtype, products_in
from cadenza.kernels.cpu_linear import PackedLinear, bf16_packing_available, native_bf16_matmul


def test_a_named_dtype_keeps_auto_products_in_float32() -> None:
    assert products_dtype("auto", torch.float32, named=True) == torch.float32
    native = torch.bfloat16 if native_bf16_matmul() else torch.float32
    assert products_dtype("auto", torch.float32, named=False) == native
    assert products_dtype("float32", torch.float32, named=False) == torch.float32
    if bf16_packing_available():  # a setting named on its own is honoured
        assert products_dtype("bfloat16", torch.float32, named=True) == torch.bfloat16


def test_precision_lists_what_auto_lowered() -> None:
    model = CadenzaTinyModel.from_seed(0)
    plain = precision_of(model, torch.float32, None, named=False)
    assert plain == Precision("float32", "float32", "fp32", "none", "auto", ())
    assert products_in(model) == torch.float32
    if bf16_packing_available():
        model.heads = PackedLinear(model.heads.weight, torch.bfloat16)
        lowered = precision_of(model, torch.bfloat16, torch.bfloat16, named=False)
        assert lowered.products == "bfloat16" and lowered.logits == "float32"
        assert lowered.lowered == ("bfloat16 products", "bf16 KV cache", "bfloat16 codec")
        named = precision_of(model, torch.bfloat16, None, named=True)
        assert named.lowered == () and named.chosen_by == "named"  # the user asked for it


def test_int8_weights_are_named_as_such() -> None:
    model = CadenzaTinyModel.from_seed(0)
    assert precision_of(model, torch.float32, None, named=False, int8_weights=True).weights == (
        "int8"
    )


def test_describe_says_every_part_and_why() -> None:
    auto = Precision("float32", "bfloat16", "bf16", "bfloat16", "auto", ("bfloat16 products",))
    line = auto.describe()
    assert "bfloat16 products" in line and "float32 logits" in line
    assert "bfloat16 codec" in line and "lowered for speed" in line
    named = Precision("float32", "float32", "fp32", "none", "named")
    assert named.describe().endswith("(named)") and "codec" not in named.describe()
