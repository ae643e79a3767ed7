"""``cadenza bench bark``: Bark's three stages batched across streams
(:class:`~cadenza.engine.models.bark.bark_batch.BarkBatch`) against ``transformers``'
``BarkModel.generate``, one request at a time and as one padded batch, same weights, one run.

Model: random weights in ``bark-small``'s shape (three stages of 12 layers at hidden 768, the
real EnCodec's shape) or ``bark-tiny`` (a smoke run), saved in the public layout and loaded by
both. Every stream speaks the same text with the voice ``v2/en_speaker_6``, greedy, with its
semantic tokens capped at ``semantic_tokens`` (random weights rarely end on their own), so
every stream makes the same audio length. Measured per stream count: wall time from the first
request to the last audio, and audio seconds made per wall second (the median of ``repeats``);
for cadenza also the seconds each stage's work took (semantic, coarse, fine, EnCodec).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cadenza.engine.models.bark.bark_batch import BarkBatch
from cadenza.engine.models.bark.bark_checkpoint import load_bark
from cadenza.engine.models.bark.bark_request import BarkRequest, BarkSampling
from cadenza.engine.models.bark.random_bark import save_random_bark

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
        bark = load_bark(directory, torch.device("cpu"), torch.float32)
        processor: Any = BarkProcessor
        processor = processor.from_pretrained(str(directory))
        rate = bark.codec.sample_rate
        rows = []
        for streams in sizes:
            stage_seconds: dict[str, float] = {}

            def ours(
                streams: int = streams, stage_seconds: dict[str, float] = stage_seconds
            ) -> float:
                batch = BarkBatch(bark)
                for seed in range(streams):
                    sampling = BarkSampling(max_semantic_tokens=semantic_tokens, seed=seed)
                    batch.add(BarkRequest(TEXT, VOICE, sampling))
                made = sum(r.audio.numel() for r in batch.run()) / rate
                stage_seconds.update({k: round(v, 3) for k, v in batch.seconds.items()})
                return made

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
            row["cadenza"]["stage_seconds"] = stage_seconds  # of its last run
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
