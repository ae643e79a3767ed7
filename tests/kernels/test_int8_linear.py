"""Weight-only INT8 linears: the Triton W8A16 kernel (interpreter) against torch, the CPU
module against the dequantized reference, and a whole model with int8 weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.config import EngineConfig
from cadenza.engine.engine import Engine
from cadenza.engine.offline import synthesize
from cadenza.kernels.int8_linear import Int8Linear, quantize_linears, quantize_weight
from cadenza.kernels.triton_support import triton_can_run


def _reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.float() @ (q.float() * scale[:, None]).T


@pytest.mark.skipif(not triton_can_run(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")
@settings(max_examples=12, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.sampled_from([1, 64, 100, 192]),
    k=st.sampled_from([16, 64, 96, 200]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 1000),
)
def test_triton_w8a16_matches_torch(m, n, k, dtype, seed):
    from cadenza.kernels.triton_int8_linear import triton_w8a16_matmul

    generator = torch.Generator().manual_seed(seed)
    q, scale = quantize_weight(torch.randn(n, k, generator=generator))
    x = torch.randn(m, k, generator=generator).to(dtype)
    out = triton_w8a16_matmul(x, q, scale)
    assert out.dtype == dtype and out.shape == (m, n)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), _reference(x, q, scale), atol=tolerance, rtol=tolerance)


def test_cpu_module_is_the_dequantized_product():
    torch.manual_seed(0)
    weight = torch.randn(48, 32)
    layer = Int8Linear(weight)
    x = torch.randn(5, 32)
    torch.testing.assert_close(layer(x), _reference(x, layer.qweight, layer.scale))
    relative = (layer(x) - x @ weight.T).norm() / (x @ weight.T).norm()
    assert float(relative) < 0.01  # 8-bit rows: well under 1 % error
    model = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 8))
    assert quantize_linears(model) == 1  # layers with a bias are left alone


def test_a_model_with_int8_weights_stays_close_to_fp32():
    config = EngineConfig(kv_cache_memory_bytes=16 << 20)
    reference = Engine.from_pretrained("cadenza-tiny", engine_config=config)
    int8 = Engine.from_pretrained("cadenza-tiny", engine_config=config, weights_dtype="int8")
    assert any(isinstance(m, Int8Linear) for m in int8.model.modules())
    logits = []
    for engine in (reference, int8):
        recorded = []
        forward = engine.runner.forward

        def wrapped(batch, masks=None, forward=forward, recorded=recorded):
            step_logits, hidden, sampling = forward(batch, masks)
            recorded.append(step_logits.clone())
            return step_logits, hidden, sampling

        engine.runner.forward = wrapped
        synthesize(engine, "int8 weights", max_duration_s=0.2)
        logits.append(recorded[0].flatten())
    cosine = torch.nn.functional.cosine_similarity(logits[0], logits[1], dim=0)
    assert float(cosine) > 0.999
