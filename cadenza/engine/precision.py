"""Which dtypes an engine computes in: the user's named dtype, or what ``auto`` chooses.

``model.dtype`` named explicitly (``"float32"``, ``"bfloat16"``, ``"float16"``) is the dtype of
the math and of the cache: the ``auto`` settings of ``cpu.linear_dtype``,
``engine.kv_dtype`` and ``cpu.codec_dtype`` follow it. ``model.dtype = "auto"`` lets them
choose: on a CPU with bf16 matrix units (AMX tiles or AVX512-BF16) a float32 model's products,
KV cache and codec run in bf16, which was measured (docs/precision.md) and is said in the
start-up log, ``/readyz`` and ``cadenza plan``. A setting named on its own (``cpu.linear_dtype
= "bfloat16"``) is honoured either way. Output heads give float32 logits in every case
(:class:`~cadenza.kernels.cpu_linear.PackedLinear`).
"""

from __future__ import annotations

import torch

from cadenza.codecs.codec import AudioCodec, CodecError
from cadenza.contract.precision import Precision
from cadenza.engine.device import kv_dtype_name
from cadenza.engine.models.model import AudioTokenModel
from cadenza.kernels.cpu_linear import PackedLinear, native_bf16_matmul, resolve_cpu_linear_dtype

_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the configuration's spelling)."""
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


def products_dtype(setting: str, model_dtype: torch.dtype, named: bool) -> torch.dtype:
    """``cpu.linear_dtype`` for a model in ``model_dtype``: ``auto`` follows a dtype the
    user ``named``; otherwise :func:`~cadenza.kernels.cpu_linear.resolve_cpu_linear_dtype`."""
    if setting == "auto" and named:
        return torch.float32
    return resolve_cpu_linear_dtype(setting)


def codec_dtype(
    setting: str, codec: AudioCodec, device: torch.device, model_dtype: torch.dtype, named: bool
) -> torch.dtype:
    """``cpu.codec_dtype`` for ``codec`` on ``device``: ``auto`` is bf16 on a CPU with native
    bf16 matrix units when the codec streams in bf16 and the user named no dtype (or named
    bf16), else fp32 (and fp32 on a GPU). Raises :class:`CodecError` when bf16 is asked of a
    codec that cannot stream in it."""
    if setting == "float32":
        return torch.float32
    supported = torch.bfloat16 in codec.streaming_dtypes
    if setting == "bfloat16":
        if not supported:
            raise CodecError(f"{type(codec).__name__} streams in float32 only")
        return torch.bfloat16
    if named and model_dtype != torch.bfloat16:
        return torch.float32
    native = device.type == "cpu" and native_bf16_matmul()
    return torch.bfloat16 if native and supported else torch.float32


def products_in(model: AudioTokenModel) -> torch.dtype:
    """What ``model``'s linear layers multiply in once it is ready to serve: bf16 when some
    packed linear or fused decode step runs bf16 products, else the model's dtype."""
    for module in model.modules():
        if isinstance(module, PackedLinear) and module.compute_dtype == torch.bfloat16:
            return torch.bfloat16
    fused = model.fused_decode
    if fused is not None and fused.weight_dtype == torch.bfloat16:
        return torch.bfloat16
    return next(model.parameters()).dtype


def precision_of(
    model: AudioTokenModel,
    kv: torch.dtype,
    codec: torch.dtype | None,
    named: bool,
    int8_weights: bool = False,
) -> Precision:
    """The :class:`Precision` ``model`` (ready to serve) announces, and what ``auto`` lowered
    below its weights' dtype."""
    weights = next(model.parameters()).dtype
    products = products_in(model)
    weights_bits = torch.finfo(weights).bits
    lowered = []
    if not named:
        if torch.finfo(products).bits < weights_bits:
            lowered.append(f"{dtype_name(products)} products")
        if kv.is_floating_point and torch.finfo(kv).bits < weights_bits:
            lowered.append(f"{kv_dtype_name(kv)} KV cache")
        if codec is not None and torch.finfo(codec).bits < 32:
            lowered.append(f"{dtype_name(codec)} codec")
    return Precision(
        weights="int8" if int8_weights else dtype_name(weights),
        products=dtype_name(products),
        kv_cache=kv_dtype_name(kv),
        codec="none" if codec is None else dtype_name(codec),
        chosen_by="named" if named else "auto",
        lowered=tuple(lowered),
    )
