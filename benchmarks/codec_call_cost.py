"""What one streaming codec call costs by its shape: cadenza-tiny's EnCodec decoder in its
serving dtype, one thread, batches of ``streams`` slots with ``frames`` frames each, and a mix
of ragged calls shaped like a served engine's (1-8 streams of 5-15 frames).

    .venv/bin/python benchmarks/codec_call_cost.py --rounds 3

Prints, per shape, the median milliseconds per call and per stream-frame over ``--rounds``.
A call has a fixed cost (the LSTM's weights, the wide convolutions of one or a few frames)
that only many stream-frames per call amortise: the table says how many.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch

from cadenza.codecs.slot_batch import SlotBatch
from cadenza.engine.engine import Engine

GRID = [(streams, frames) for frames in (5, 8, 15, 30) for streams in (1, 2, 4, 8, 16)]


def call_ms(decoder: Any, slots: SlotBatch, lengths: list[int]) -> float:
    """One ``decode_batch`` of ``lengths`` frames on the first ``len(lengths)`` slots, in ms."""
    count = len(lengths)
    codes = torch.randint(0, 1024, (count, 8, max(lengths)))
    started = time.perf_counter()
    decoder.decode_batch(codes, lengths, slots.rows(list(range(count))), [False] * count)
    return 1000 * (time.perf_counter() - started)


def per_frame_ms(decoder: Any, slots: SlotBatch, calls: list[list[int]]) -> float:
    total = sum(call_ms(decoder, slots, lengths) for lengths in calls)
    return total / sum(sum(lengths) for lengths in calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=64 << 20)
    decoder: Any = engine._audio_stage().decoder  # the engine's own streaming decoder
    slots = SlotBatch.on([decoder.open() for _ in range(16)], "cpu")
    rng = random.Random(0)
    mixed = [[rng.randint(5, 15) for _ in range(rng.randint(1, 8))] for _ in range(100)]
    per_call: dict[tuple[int, int], list[float]] = {shape: [] for shape in GRID}
    mixed_ms: list[float] = []
    for streams, frames in GRID[:3]:
        call_ms(decoder, slots, [frames] * streams)  # warm up
    for _ in range(args.rounds):
        for streams, frames in GRID:
            times = [call_ms(decoder, slots, [frames] * streams) for _ in range(5)]
            per_call[(streams, frames)].append(statistics.median(times))
        mixed_ms.append(per_frame_ms(decoder, slots, mixed))
    print("| streams | frames | ms a call | ms a stream-frame |")
    print("| --- | --- | --- | --- |")
    for (streams, frames), values in per_call.items():
        median = statistics.median(values)
        print(f"| {streams} | {frames} | {median:.2f} | {median / (streams * frames):.3f} |")
    mean_frames = statistics.mean(sum(lengths) for lengths in mixed)
    print(
        f"| 1-8 | 5-15 (ragged, {mean_frames:.0f} stream-frames a call) | | "
        f"{statistics.median(mixed_ms):.3f} |"
    )


if __name__ == "__main__":
    main()
