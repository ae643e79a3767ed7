"""``cadenza bench bark``: Bark served by the engine (every stream's semantic and coarse tokens
batched with the others' in the paged KV, its fine windows as they complete) against
``transformers``' ``BarkModel.generate``, one request at a time and as one padded batch, same
weights, one run.

Model: random weights in ``bark-small``'s shape (three stages of 12 layers at hidden 768, the
real EnCodec's shape) or ``bark-tiny`` (a smoke run), saved in the public layout and loaded by
both. Every stream speaks the same text with the voice ``v2/en_speaker_6``, greedy, with its
semantic tokens capped at ``semantic_tokens`` (random weights rarely end on their own), so
every stream makes the same audio length. Measured per stream count: wall time from the first
request to the last audio, and audio seconds made per wall second (the median of ``repeats``);
for the engine also each stream's first audio (the median over streams of the last run).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cadenza.bench.random_bark import save_random_bark
from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

TEXT = "hello world the quick brown fox jumps over the lazy dog"
VOICE = "v2/en_speaker_6"


def _median_seconds(work: Callable[[], float], repeats: int) -> tuple[float, float]:
    """(median wall seconds, audio seconds of one run) over ``repeats`` runs of ``work``,
    which returns the audio seconds it made."""
    times, audio = [], 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        audio = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), audio


def run(
    sizes: tuple[int, ...],
    *,
    repeats: int = 1,
    progress: bool = True,
    shape: str = "bark-small",
    semantic_tokens: int = 100,
) -> dict[str, Any]:
    """Measure each stream count of ``sizes``; the result as a JSON-able dict."""
    from transformers import BarkProcessor

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        reference = save_random_bark(directory, shape)
        processor: Any = BarkProcessor
        processor = processor.from_pretrained(str(directory))
        rate = reference.generation_config.sample_rate
        config = EngineConfig(
            max_num_seqs=max(sizes),
            enable_prefix_caching=False,
            kv_cache_memory_bytes=1 << 30,
        )
        engine = Engine.from_pretrained(
            str(directory), dtype="float32", engine_config=config,
            cpu=CpuConfig(linear_dtype="float32"),
        )  # fmt: skip
        # The stream length whose semantic tokens (at Bark's rate, rounded up) are the cap.
        semantic_hz = reference.generation_config.semantic_config["semantic_rate_hz"]
        duration = math.floor(semantic_tokens * engine.frame_rate / semantic_hz) / engine.frame_rate
        _run_engine(engine, max(sizes), duration, [])  # warm up: the first steps allocate
        rows = []
        for streams in sizes:
            first_audio: list[float] = []

            def ours(streams: int = streams, first_audio: list[float] = first_audio) -> float:
                return _run_engine(engine, streams, duration, first_audio)

            def one_by_one(streams: int = streams) -> float:
                inputs = processor(TEXT, voice_preset=VOICE)
                made = 0
                with torch.no_grad():
                    for _ in range(streams):
                        made += reference.generate(
                            **inputs, semantic_max_new_tokens=semantic_tokens
                        ).shape[-1]
                return made / rate

            def padded_batch(streams: int = streams) -> float:
                inputs = processor([TEXT] * streams, voice_preset=VOICE)
                with torch.no_grad():
                    audio = reference.generate(**inputs, semantic_max_new_tokens=semantic_tokens)
                return audio.numel() / rate

            row: dict[str, Any] = {"streams": streams}
            for name, work in (
                ("cadenza", ours),
                ("transformers_one_by_one", one_by_one),
                ("transformers_batched", padded_batch),
            ):
                seconds, audio = _median_seconds(work, repeats)
                row[name] = {
                    "wall_s": round(seconds, 3),
                    "audio_s": round(audio, 3),
                    "audio_s_per_s": round(audio / seconds, 4),
                }
                if progress:
                    print(f"bark {shape} streams={streams} {name}: {row[name]}", flush=True)
            row["cadenza"]["first_audio_s_median"] = round(statistics.median(first_audio), 3)
            base = row["transformers_one_by_one"]["audio_s_per_s"]
            row["speedup_vs_one_by_one"] = round(row["cadenza"]["audio_s_per_s"] / base, 2)
            rows.append(row)
    return {
        "benchmark": "bark",
        "shape": shape,
        "semantic_tokens": semantic_tokens,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def _run_engine(engine: Engine, streams: int, duration_s: float, first_audio: list[float]) -> float:
    """Run ``streams`` greedy streams to their end; the audio seconds they made. Each stream's
    first audio (seconds after the requests went in) goes to ``first_audio`` (replaced)."""
    greedy = SamplingParams(temperature=0.0)
    started = time.perf_counter()
    ids = [f"bench-{i}-{time.monotonic_ns()}" for i in range(streams)]
    for request_id in ids:
        engine.add_request(SynthesisRequest(request_id, TEXT, VOICE, duration_s, greedy))
    samples = 0
    first: dict[str, float] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.audio.size and output.request_id not in first:
                first[output.request_id] = time.perf_counter() - started
            samples += output.audio.size
    first_audio[:] = [first[request_id] for request_id in ids]
    return samples / engine.sample_rate
