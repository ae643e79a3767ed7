"""A 1-D convolution to one output channel on the CPU through a native kernel: the last layer
of a SEANet codec decoder (its few channels into the waveform).

oneDNN runs such a convolution at a few GMAC/s (nothing to block the single output over):
EnCodec's 32 -> 1 output conv took a tenth of a streaming decode for a hundredth of its work.
``native/cpu_mono_conv.cpp`` computes each output as a dot product of its time-major window with the
weight, accumulated in float32. :meth:`MonoConv.build` returns ``None`` where it does not apply
(no C++ compiler, channels not a multiple of 16): callers keep their convolution.
"""

from __future__ import annotations

import ctypes

import torch

from cadenza.kernels.native import loader

LIBRARY = "cpu_mono_conv"
_ENTRY_POINTS = {torch.float32: "cadenza_mono_conv_f32", torch.bfloat16: "cadenza_mono_conv_bf16"}
_CHANNEL_MULTIPLE = 16


class MonoConv:
    """``weight [1, C, k]`` (and an optional one-element bias) with ``dilation``, ready for
    the kernel."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dilation: int,
        library: ctypes.CDLL,
    ) -> None:
        _, self.in_channels, self.kernel = (int(n) for n in weight.shape)
        self.dilation = dilation
        self.taps = weight.detach()[0].t().float().contiguous()  # [k, C]
        self.bias = 0.0 if bias is None else float(bias.detach().float().reshape(-1)[0])
        self._functions = {dtype: getattr(library, name) for dtype, name in _ENTRY_POINTS.items()}

    @classmethod
    def build(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
    ) -> MonoConv | None:
        """The kernel's conv, or ``None`` where it does not apply (see the module)."""
        if weight.dim() != 3 or weight.shape[0] != 1 or weight.device.type != "cpu":
            return None
        if weight.shape[1] % _CHANNEL_MULTIPLE:
            return None
        library = loader.load(LIBRARY)
        return None if library is None else cls(weight, bias, dilation, library)

    def applies(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (``[B, C, L]``) can go through the kernel: on the CPU, float32 or
        bfloat16, time-major."""
        return (
            x.dim() == 3
            and x.device.type == "cpu"
            and x.dtype in self._functions
            and x.shape[1] == self.in_channels
            and x.transpose(1, 2).is_contiguous()
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, L]`` time-major (see :meth:`applies`) -> ``[B, 1, L - (k - 1) *
        dilation]`` in ``x``'s dtype. Raises ``ValueError`` for any other input."""
        if not self.applies(x):
            raise ValueError(
                f"the native conv takes a time-major CPU [B, {self.in_channels}, L] tensor in "
                "float32 or bfloat16"
            )
        batch, _, length = x.shape
        steps = max(length - (self.kernel - 1) * self.dilation, 0)
        out = torch.empty(batch, 1, steps)
        if batch and steps:
            self._functions[x.dtype](
                x.data_ptr(),
                batch,
                length,
                self.in_channels,
                self.taps.data_ptr(),
                self.kernel,
                self.dilation,
                self.bias,
                out.data_ptr(),
            )
        return out.to(x.dtype)
