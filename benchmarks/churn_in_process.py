"""One engine under closed-loop churn, in process: how a served replica's time compares with
its calibration, without the edge, the network or a second replica.

    .venv/bin/python benchmarks/churn_in_process.py --streams 8 --seconds 30 [--listeners]

cadenza-tiny on one thread (pinned to CPU 0 where the OS allows), its calibration applied
(the cached one, or measured now). ``--streams`` requests of 40-120 characters (the load
tester's default texts) run in real time; when one finishes generating, a new one starts at
once, so prompts, first chunks and ragged codec calls keep coming. With ``--listeners`` a new
one starts only once the finished stream's audio has played out (the load tester's
closed-loop listeners, what a served replica sees): streams that finished generating wait out
their lead, so fewer decode together and the engine races the rest ahead in smaller steps.
Prints the engine's steps and rows, its codec calls (streams and frames a call, milliseconds a
stream-frame), each step kind's time outside the codec against what the calibrated model
predicts for it, measured over predicted decode time by rows a step the way admission's
realtime factor counts it (each step's frames at the run's own codec cost a stream-frame),
and the time to first audio.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import time
from typing import Any

import torch

from cadenza.config import EngineConfig
from cadenza.contract.engine_stats import StepRecord
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.calibration import load_or_calibrate
from cadenza.loadtest.workload import TextLengths

TEXTS = TextLengths(40, 120)  # the load tester's default utterances


class CodecCalls:
    """Wraps a streaming decoder's ``decode`` to record each call's streams, frames, seconds."""

    def __init__(self, decoder: Any) -> None:
        self.calls: list[tuple[int, int, float]] = []
        self._decode = decoder.decode
        decoder.decode = self

    def __call__(self, chunks: dict[int, torch.Tensor], final: frozenset[int] = frozenset()) -> Any:
        started = time.perf_counter()
        out = self._decode(chunks, final)
        frames = sum(int(chunk.shape[1]) for chunk in chunks.values())
        self.calls.append((len(chunks), frames, time.perf_counter() - started))
        return out


def run(streams: int, seconds: float, listeners: bool = False) -> None:
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=512 << 20)
    )
    calibration = load_or_calibrate(engine)
    engine.apply_calibration(calibration)
    assert calibration is not None and engine.policy is not None
    model = calibration.model
    codec = CodecCalls(engine._audio_stage().decoder)
    rng = random.Random(1)
    arrived: dict[str, float] = {}
    first_audio: dict[str, float] = {}
    audio_s: dict[str, float] = {}
    replays: list[float] = []  # when a listener asks again (with --listeners)
    started_count = 0

    def start() -> None:
        nonlocal started_count
        request_id = f"r{started_count}"
        text = TEXTS.sample(rng)
        sampling = SamplingParams(seed=started_count)
        engine.add_request(SynthesisRequest(request_id, text, max_duration_s=30, sampling=sampling))
        arrived[request_id] = time.monotonic()
        audio_s[request_id] = 0.0
        started_count += 1

    for _ in range(streams):
        start()
    engine.telemetry.take_report()
    begin = time.monotonic()
    cpu_begin = time.process_time()
    records: list[StepRecord] = []
    steps = 0
    while time.monotonic() - begin < seconds:
        while replays and replays[0] <= time.monotonic():
            heapq.heappop(replays)
            start()
        idle = engine.idle_s()
        if idle > 0 or not engine.has_unfinished_requests():
            time.sleep(min(max(idle, 0.0005), 0.002))
            continue
        outputs = engine.step()
        steps += 1
        if steps % 1000 == 0:  # the telemetry keeps the latest few thousand steps
            records.extend(engine.telemetry.take_report().steps)
        for output in outputs:
            if output.audio.size:
                first_audio.setdefault(output.request_id, time.monotonic())
                audio_s[output.request_id] += output.audio.size / engine.info.sample_rate
            if output.finish_reason is None:
                continue
            if listeners:  # played out from its first chunk on
                played = first_audio.get(output.request_id, time.monotonic())
                heapq.heappush(replays, played + audio_s[output.request_id])
            else:
                start()
    records.extend(engine.telemetry.take_report().steps)
    elapsed = time.monotonic() - begin
    cpu = (time.process_time() - cpu_begin) / elapsed
    calls = codec.calls
    frames = sum(f for _, f, _ in calls)
    codec_s = sum(s for _, _, s in calls)
    rows = sum(r.decodes for r in records)
    print(
        f"{streams} streams, {elapsed:.0f} s: {len(records) / elapsed:.1f} steps/s, "
        f"{rows / max(len(records), 1):.2f} rows a step, {rows / elapsed:.0f} rows/s, "
        f"engine CPU {cpu:.2f} of a core, {started_count - streams} streams finished"
    )
    if calls:
        print(
            f"codec: {len(calls) / elapsed:.1f} calls/s, "
            f"{statistics.mean(c[0] for c in calls):.2f} streams and {frames / len(calls):.1f} "
            f"frames a call, {1000 * codec_s / len(calls):.1f} ms a call, "
            f"{1000 * codec_s / max(frames, 1):.3f} ms a stream-frame "
            f"(calibration: {calibration.codec_ms_per_frame:.3f}), "
            f"{codec_s / elapsed:.2f} of the time"
        )
    print("| step kind | steps | rows a step | ms outside the codec | model predicts | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in ("decode", "prompt"):
        chosen = [
            r
            for r in records
            if r.decodes and (r.tokens > r.decodes) == (kind == "prompt") and r.rested_s <= 0.002
        ]
        if not chosen:
            continue
        measured = statistics.mean(1000 * (r.seconds - r.codec_s) for r in chosen)
        predicted = statistics.mean(
            model.predict_ms(r.tokens, r.context_tokens)
            - r.decodes * calibration.codec_ms_per_frame
            for r in chosen
        )
        print(
            f"| {kind} | {len(chosen)} | {statistics.mean(r.decodes for r in chosen):.2f} | "
            f"{measured:.2f} | {predicted:.2f} | {measured / predicted:.2f} |"
        )
    codec_ms = 1000 * codec_s / max(frames, 1)
    print("| rows a step | steps | measured / predicted (the realtime factor's way) |")
    print("| --- | --- | --- |")
    for low, high in ((1, 3), (4, 6), (7, 9), (10, 12), (13, 10**6)):
        counted = [
            r
            for r in records
            if low <= r.decodes <= high and r.tokens <= 2 * r.decodes and r.rested_s <= 0.002
        ]
        if counted:
            measured = sum(1000 * (r.seconds - r.codec_s) + r.decodes * codec_ms for r in counted)
            predicted = sum(model.predict_ms(r.tokens, r.context_tokens) for r in counted)
            label = f"{low}-{high}" if high < 10**6 else f"{low}+"
            print(f"| {label} | {len(counted)} | {measured / predicted:.2f} |")
    ttfa = sorted(first_audio[r] - arrived[r] for r in first_audio)
    if ttfa:
        p95 = ttfa[min(int(0.95 * len(ttfa)), len(ttfa) - 1)]
        print(f"TTFA p50 {1000 * statistics.median(ttfa):.0f} ms, p95 {1000 * p95:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="8", help="comma-separated stream counts")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument(
        "--listeners",
        action="store_true",
        help="a new request once the finished one's audio has played out (not at once)",
    )
    parser.add_argument(
        "--onednn-linears",
        action="store_true",
        help="bf16 linears outside the fused step on oneDNN, not the native product (A/B)",
    )
    args = parser.parse_args()
    if args.onednn_linears:
        import cadenza.kernels.cpu_linear as cpu_linear

        cpu_linear.native_linear_library = lambda: None  # type: ignore[assignment]
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    for streams in (int(n) for n in args.streams.split(",")):
        run(streams, args.seconds, args.listeners)


if __name__ == "__main__":
    main()
