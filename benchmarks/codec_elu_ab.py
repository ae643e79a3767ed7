"""The streaming EnCodec decode with the native ELU against torch's, side by side in one
process (cadenza-tiny's codec in its serving dtype, one thread).

    .venv/bin/python benchmarks/codec_elu_ab.py --streams 10 --frames 13 --rounds 5

Each round decodes ``--frames`` frames for ``--streams`` slots five times with each ELU;
prints ms per stream-frame per round and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cadenza.codecs.slot_batch import SlotBatch
from cadenza.engine.engine import Engine
from cadenza.kernels import cpu_elu


def torch_elu(x: torch.Tensor, alpha: float = 1.0, inplace: bool = False) -> torch.Tensor:
    return F.elu(x, alpha, inplace=inplace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--frames", type=int, default=13)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=64 << 20)
    decoder: Any = engine._audio_stage().decoder  # the engine's own streaming decoder
    slots = SlotBatch.on([decoder.open() for _ in range(args.streams)], "cpu")
    lengths = [args.frames] * args.streams
    final = [False] * args.streams
    codes = torch.randint(0, 1024, (args.streams, 8, args.frames))
    for _ in range(3):
        decoder.decode_batch(codes, lengths, slots, final)
    elus: dict[str, Callable[..., torch.Tensor]] = {"torch": torch_elu, "native": cpu_elu.elu}
    results: dict[str, list[float]] = {name: [] for name in elus}
    native = cpu_elu.elu
    try:
        for _ in range(args.rounds):
            for name, elu in elus.items():
                cpu_elu.elu = elu
                started = time.perf_counter()
                for _ in range(5):
                    decoder.decode_batch(codes, lengths, slots, final)
                elapsed = (time.perf_counter() - started) / 5
                results[name].append(1000 * elapsed / (args.streams * args.frames))
    finally:
        cpu_elu.elu = native
    for name, values in results.items():
        rounded = [round(v, 3) for v in values]
        print(f"{name}: {rounded} -> median {statistics.median(values):.3f} ms a frame")


if __name__ == "__main__":
    main()
