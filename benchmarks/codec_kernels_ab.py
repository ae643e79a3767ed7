"""The streaming EnCodec decode with its native CPU kernels (the LSTM, the output conv)
against torch's, side by side in one process (cadenza-tiny's codec in its serving dtype, one
thread).

    .venv/bin/python benchmarks/codec_kernels_ab.py --rounds 5

Two decoders of the same codec: one whose LSTM runs ``cpu_lstm.cpp`` and whose output conv
runs ``cpu_mono_conv.cpp``, one on ``torch.nn.LSTM`` and oneDNN's conv. Each round times,
alternating between them, calls of the shapes a served engine makes (one stream's first chunk,
uniform chunks, ragged chunks where streams joined a due call early) and prints the median ms
a call per shape and the ratio, and the same for the LSTM stage and the output conv stage
alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.engine.engine import Engine
from cadenza.kernels import cpu_lstm, cpu_mono_conv

SHAPES = [[8], [15] * 2, [15] * 5, [15, 15, 15, 8, 5], [15] * 8, [15] * 5 + [12, 9, 6]]


def call_ms(decoder: Any, slots: SlotBatch, lengths: list[int], stage: int | None) -> float:
    """One decode of ``lengths`` frames (the whole decoder, or only stage ``stage``, fed
    random input of its shape), in ms."""
    count = len(lengths)
    if stage is None:
        codes = torch.randint(0, 1024, (count, 8, max(lengths)))
        started = time.perf_counter()
        decoder.decode_batch(codes, lengths, slots.rows(list(range(count))), [False] * count)
        return 1000 * (time.perf_counter() - started)
    if stage == len(decoder._stages) - 1:  # the output conv, at the waveform's rate
        channels, hop = decoder._stages[stage].in_channels, decoder.hop_length
        lengths = [n * hop for n in lengths]
    else:
        channels = 512
    x = torch.randn(count, max(lengths), channels, dtype=decoder.compute_dtype).transpose(1, 2)
    started = time.perf_counter()
    decoder._stages[stage].forward(x, lengths, slots.rows(list(range(count))), [False] * count)
    return 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=64 << 20)
    native: Any = engine._audio_stage().decoder  # the engine's own streaming decoder
    builds = (cpu_lstm.NativeLstm.build, cpu_mono_conv.MonoConv.build)
    cpu_lstm.NativeLstm.build = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]
    cpu_mono_conv.MonoConv.build = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]
    plain = EncodecStreamingDecoder(native.codec, 8, native.compute_dtype)
    cpu_lstm.NativeLstm.build, cpu_mono_conv.MonoConv.build = builds  # type: ignore[method-assign]
    lstm_stage = next(i for i, s in enumerate(native._stages) if hasattr(s, "native"))
    assert native._stages[lstm_stage].native is not None, "no native LSTM on this machine"
    output_stage = len(native._stages) - 1
    assert native._stages[output_stage].conv.mono is not None, "no native output conv"
    decoders = {"native": native, "torch": plain}
    slots = {
        name: SlotBatch.on([d.open() for _ in range(8)], "cpu") for name, d in decoders.items()
    }
    times: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.rounds + 1):  # the first round warms up, unrecorded
        for shape in SHAPES:
            for part, stage in (("call", None), ("lstm", lstm_stage), ("out", output_stage)):
                for _ in range(5):
                    for name, decoder in decoders.items():
                        ms = call_ms(decoder, slots[name], shape, stage)
                        times.setdefault((str(shape), part, name), []).append(ms)
    print(
        "| lengths | call: native / torch ms | ratio | LSTM stage: native / torch ms | ratio "
        "| output conv stage: native / torch ms | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in SHAPES:
        row = [str(shape)]
        for part in ("call", "lstm", "out"):
            native_ms, torch_ms = (
                statistics.median(times[(str(shape), part, name)][5:]) for name in decoders
            )
            row += [f"{native_ms:.2f} / {torch_ms:.2f}", f"{torch_ms / native_ms:.2f}x"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
