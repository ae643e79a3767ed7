"""Weight-only INT8 linear layers (W8A16): int8 weights, one float scale per output channel.

``Int8Linear`` keeps ``q = round(W / s)`` (int8) and ``s = max|W_row| / 127`` per output row.
How it multiplies depends on the device, measured (docs/benchmarks.md):

* **CUDA**: the Triton kernel (:mod:`cadenza.kernels.triton_int8_linear`) reads the int8
  weights, half the bytes of fp16, which is what a memory-bound decode step pays for;
* **CPU**: dequantize on load. On the development machine ``torch._weight_int8pack_mm`` was
  6-70x slower than the fp32 product for 1-64 rows, and dequantizing per call 3-40x slower,
  so the CPU keeps one fp32 copy of ``q * s`` (prepacked for oneDNN like every other fp32
  linear): outputs are those of the int8 model, speed that of fp32, and the weights' memory
  is not reduced there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.cpu_linear import PackedLinear, packing_available
from cadenza.kernels.linear_swap import swap_linears
from cadenza.kernels.triton_support import triton_installed


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` -> ``(int8 [N, K], float32 scale [N])``, symmetric per output row."""
    scale = (weight.detach().float().abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(weight.detach().float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_weight(weight)
        self.register_buffer("qweight", q.to(weight.device))
        self.register_buffer("scale", scale.to(weight.device))
        self.cpu_linear: nn.Module | None = None
        if weight.device.type == "cpu":
            dequantized = (q.float() * scale[:, None]).to(weight.dtype)
            if packing_available(weight.device, weight.dtype):
                self.cpu_linear = PackedLinear(dequantized)
            else:
                self.cpu_linear = nn.Linear(self.in_features, self.out_features, bias=False)
                self.cpu_linear.weight = nn.Parameter(dequantized, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_linear is not None:
            return self.cpu_linear(x)
        if x.device.type == "cuda" and triton_installed():
            from cadenza.kernels.triton_int8_linear import triton_w8a16_matmul

            return triton_w8a16_matmul(x, self.qweight, self.scale)
        weight = self.qweight.to(x.dtype) * self.scale[:, None].to(x.dtype)
        return F.linear(x, weight)


def quantize_linears(module: nn.Module) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in
    place; returns how many. Call after the weights are on their device."""
    return swap_linears(module, Int8Linear)
