"""The Llama backbone's fused and rearranged ops against the textbook formulas they replace,
bit for bit in float32: RMSNorm as one op, rotary with pre-signed sines, q and k rotated in
one call."""

from __future__ import annotations

import torch

from cadenza.engine.models.llama import (
    LlamaBackboneConfig,
    LlamaMLP,
    RMSNorm,
    RotaryEmbedding,
    apply_rotary,
)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def test_rms_norm_equals_the_unfused_formula_bit_for_bit():
    norm = RMSNorm(256, 1e-5)
    norm.weight.data = torch.randn(256)
    x = torch.randn(13, 256) * 3
    expected = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(norm(x), expected)


def test_rotary_equals_rotate_half_bit_for_bit_at_large_positions():
    rotary = RotaryEmbedding(64, 500_000.0)
    positions = torch.tensor([0, 1, 7, 1000, 2047])
    cos, signed_sin = rotary(positions)
    freqs = positions.float()[:, None] * rotary.inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    x = torch.randn(5, 6, 64)
    expected = x * angles.cos() + _rotate_half(x) * angles.sin()
    assert torch.equal(apply_rotary(x, cos, signed_sin), expected)
    # q and k side by side in one tensor rotate as they would apart
    q, k = x[:, :4], x[:, 4:]
    assert torch.equal(apply_rotary(x, cos, signed_sin)[:, 4:], apply_rotary(k, cos, signed_sin))
    assert torch.equal(apply_rotary(x, cos, signed_sin)[:, :4], apply_rotary(q, cos, signed_sin))


def test_rotary_promotes_bf16_inputs_into_the_requested_dtype():
    cos, signed_sin = RotaryEmbedding(64, 10_000.0)(torch.arange(3))
    x = torch.randn(3, 2, 64).bfloat16()
    out = apply_rotary(x, cos, signed_sin, torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out, apply_rotary(x.float(), cos, signed_sin))


def test_mlp_keeps_half_models_in_their_dtype_and_promotes_kept_bf16_products():
    config = LlamaBackboneConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
    )
    mlp = LlamaMLP(config)
    x = torch.randn(5, 64)
    expected = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    half = LlamaMLP(config).to(torch.bfloat16)
    half.load_state_dict(mlp.state_dict())
    out = half(x.bfloat16())
    assert out.dtype == torch.bfloat16  # a half model's activations stay half
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.05)
    mlp.fuse_projections()

    class KeptBf16(torch.nn.Module):  # a product that leaves bf16, as a kept PackedLinear does
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, rows: torch.Tensor) -> torch.Tensor:
            return self.inner(rows).bfloat16()

    assert mlp.gate_up_proj is not None
    rounded_gate_up = KeptBf16(mlp.gate_up_proj)
    converted = mlp.down_proj(
        (lambda g, u: torch.nn.functional.silu(g) * u)(*rounded_gate_up(x).float().chunk(2, -1))
    )
    mlp.gate_up_proj = rounded_gate_up
    kept = mlp(x)
    assert kept.dtype == torch.float32
    assert torch.equal(kept, converted)  # promoting equals converting first, bit for bit
