"""One streaming-decoder convolution three ways, side by side in one process: ``F.conv1d`` on
channel-major storage (before), a 2-D conv over time-major (channels-last) storage, and the
matrix product of the ``k`` shifted time-major views (:class:`cadenza.codecs.ragged.Conv`
picks one of the last two by width). Shapes from EnCodec's and Mimi's decoders at the batch
and chunk the engine decodes.

    .venv/bin/python benchmarks/codec_convs.py

Prints the median milliseconds per call of each, per shape and dtype.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

# (batch, C_in, C_out, time steps in, kernel): the codec's decoders at the engine's chunk
SHAPES = [
    (16, 32, 32, 4800, 1),
    (16, 64, 32, 2402, 3),
    (16, 64, 64, 2401, 2),
    (16, 128, 64, 602, 3),
    (16, 256, 640, 121, 2),
    (16, 512, 2048, 16, 2),
    (8, 512, 1024, 12, 7),
    (8, 1024, 4096, 7, 2),
]


def _median_ms(call: Callable[[], torch.Tensor], repeats: int = 10) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    print(
        "| dtype | batch, C_in, C_out, T, k | conv1d (channel-major) | 2-D conv (time-major) "
        "| product (time-major) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for dtype in (torch.bfloat16, torch.float32):
        for batch, c_in, c_out, steps, kernel in SHAPES:
            x = torch.randn(batch, c_in, steps, dtype=dtype)
            weight = torch.randn(c_out, c_in, kernel, dtype=dtype)
            bias = torch.randn(c_out, dtype=dtype)
            storage = x.transpose(1, 2).contiguous()  # [B, T, C]
            image = storage.transpose(1, 2).unsqueeze(2)
            weight4 = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            matrix = weight.permute(2, 1, 0).reshape(-1, c_out).contiguous()
            out_steps = steps - kernel + 1

            def product() -> torch.Tensor:
                taps = [storage[:, j : j + out_steps] for j in range(kernel)]  # noqa: B023
                columns = torch.cat(taps, dim=-1).reshape(batch * out_steps, -1)  # noqa: B023
                return torch.addmm(bias, columns, matrix)  # noqa: B023

            times = [
                _median_ms(lambda: F.conv1d(x, weight, bias)),  # noqa: B023
                _median_ms(lambda: F.conv2d(image, weight4, bias)),  # noqa: B023
                _median_ms(product),
            ]
            name = str(dtype).removeprefix("torch.")
            shape = f"{batch}, {c_in}, {c_out}, {steps}, {kernel}"
            print(f"| {name} | {shape} | " + " | ".join(f"{t:.2f}" for t in times) + " |")


if __name__ == "__main__":
    main()
