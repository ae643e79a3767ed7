"""``cadenza bench codec``: audio-seconds decoded per wall-second, streaming and batched
(cadenza) against ``transformers``' offline ``EncodecModel.decode`` per stream, same codes,
same weights, one run.

Each stream is 3 s (225 frames). cadenza decodes every stream chunk by chunk (15 frames, the
engine's chunk) with all streams in one call per chunk; ``transformers`` decodes each stream's
whole code sequence in one call, streams one after another (what a server without a batched
streaming decoder does at best: it cannot even start before the last frame).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from cadenza.codecs.encodec import build_random_encodec, load_encodec
from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder

FRAMES = 225
CHUNK = 15


def run(
    stream_counts: tuple[int, ...] = (1, 4, 8, 16), repeats: int = 3, progress: bool = False
) -> dict[str, Any]:
    codec = load_encodec("encodec_24khz", seed=0)
    reference = build_random_encodec(seed=0)  # the same weights, as transformers runs them
    decoder = EncodecStreamingDecoder(codec, max(stream_counts))
    results = []
    for count in stream_counts:
        codes = torch.randint(0, codec.codebook_size, (count, codec.num_codebooks, FRAMES))
        audio_s = count * FRAMES / codec.frame_rate
        _time_reference(reference, codes[:1])  # warm-up
        _time_streaming(decoder, codes[:1])
        # Alternate the two sides so drifts of a shared machine hit both alike.
        ref_runs, our_runs = [], []
        for _ in range(repeats):
            ref_runs.append(_time_reference(reference, codes))
            our_runs.append(_time_streaming(decoder, codes))
        ref_s, ours_s = statistics.median(ref_runs), statistics.median(our_runs)
        entry = {
            "streams": count,
            "transformers_audio_s_per_s": audio_s / ref_s,
            "cadenza_audio_s_per_s": audio_s / ours_s,
            "speedup": ref_s / ours_s,
            "cadenza_ms_per_chunk_call": 1000 * ours_s / (FRAMES // CHUNK),
        }
        results.append(entry)
        if progress:
            print(entry, flush=True)
    return {
        "benchmark": "codec",
        "codec": "encodec_24khz (random weights, 8 codebooks)",
        "frames_per_stream": FRAMES,
        "chunk_frames": CHUNK,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "results": results,
    }


def _time_reference(model: Any, codes: torch.Tensor) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for index in range(codes.shape[0]):
            model.decode(codes[index : index + 1][None], [None])
    return time.perf_counter() - started


def _time_streaming(decoder: EncodecStreamingDecoder, codes: torch.Tensor) -> float:
    count = codes.shape[0]
    started = time.perf_counter()
    slots = [decoder.open() for _ in range(count)]
    for start in range(0, FRAMES, CHUNK):
        decoder.decode({slot: codes[i, :, start : start + CHUNK] for i, slot in enumerate(slots)})
    for slot in slots:
        decoder.close(slot)
    return time.perf_counter() - started
