"""``cadenza bench snac``: cadenza's exact streaming SNAC decoder against the window method the
Orpheus peer servers use, same codes, same weights (the 24 kHz architecture, random weights,
noise off), one run.

* cadenza: every stream decoded chunk by chunk (2 frames, the engine's chunk for SNAC) with all
  streams in one call per chunk; output equal to the offline decode.
* window: for each new frame, the peers decode the last 4 frames (28 tokens) offline and keep
  the second frame's 2048 samples, stream by stream. Approximate (the SNR against the offline
  decode is reported), about 4x the decoder work, and never emits the first frame or the last
  two.

Reported per stream count: audio-seconds decoded per wall-second for both, their ratio, and
the error of each against the offline decode.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from cadenza.codecs.snac import SnacCodec, load_snac

FRAMES = 35  # 3 s at 11.7 frames/s
CHUNK = 2
WINDOW = 4  # frames the peers decode per frame
KEPT = 1  # the frame of the window they keep


def run(
    stream_counts: tuple[int, ...] = (1, 4, 8), repeats: int = 3, progress: bool = False
) -> dict[str, Any]:
    codec = load_snac(noise=False)
    decoder = codec.streaming_decoder(max(stream_counts))
    results = []
    for count in stream_counts:
        codes = torch.randint(0, codec.codebook_size, (count, codec.num_codebooks, FRAMES))
        audio_s = count * FRAMES / codec.frame_rate
        _window(codec, codes[:1, :, :WINDOW])  # warm-up
        _streaming(decoder, codes[:1, :, :WINDOW])
        window_runs, our_runs = [], []
        for _ in range(repeats):  # alternated, so drifts of a shared machine hit both alike
            window_runs.append(_window(codec, codes)[0])
            our_runs.append(_streaming(decoder, codes)[0])
        window_s, ours_s = statistics.median(window_runs), statistics.median(our_runs)
        entry = {
            "streams": count,
            "window_audio_s_per_s": round(audio_s / window_s, 2),
            "cadenza_audio_s_per_s": round(audio_s / ours_s, 2),
            "speedup": round(window_s / ours_s, 2),
        }
        results.append(entry)
        if progress:
            print(entry, flush=True)
    codes = torch.randint(0, codec.codebook_size, (1, codec.num_codebooks, FRAMES))
    offline = codec.decode(codes)[0]
    _, windowed = _window(codec, codes)
    _, streamed = _streaming(decoder, codes)
    hop = codec.hop_length
    covered = offline[KEPT * hop : KEPT * hop + windowed[0].numel()]
    return {
        "benchmark": "snac",
        "codec": "snac_24khz (random weights, noise off)",
        "frames_per_stream": FRAMES,
        "chunk_frames": CHUNK,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "lookahead_ms": {
            "cadenza": round(1000 * decoder.lookahead_samples / codec.sample_rate, 1),
            "window": round(1000 * (WINDOW - 1 - KEPT) * hop / codec.sample_rate, 1),
        },
        "error_vs_offline": {
            "cadenza_max_abs": float((streamed[0] - offline).abs().max()),
            "window_snr_db": round(_snr_db(covered, windowed[0]), 1),
            "window_missing_frames": FRAMES - windowed[0].numel() // hop,
        },
        "results": results,
    }


def _streaming(decoder: Any, codes: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    count, _, frames = codes.shape
    started = time.perf_counter()
    slots = [decoder.open() for _ in range(count)]
    pieces: list[list[torch.Tensor]] = [[] for _ in range(count)]
    for start in range(0, frames, CHUNK):
        final = frozenset(slots) if start + CHUNK >= frames else frozenset()
        chunk = {slot: codes[i, :, start : start + CHUNK] for i, slot in enumerate(slots)}
        out = decoder.decode(chunk, final)
        for i, slot in enumerate(slots):
            pieces[i].append(out[slot])
    elapsed = time.perf_counter() - started
    return elapsed, [torch.cat(p) for p in pieces]


def _window(codec: SnacCodec, codes: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    count, _, frames = codes.shape
    hop = codec.hop_length
    started = time.perf_counter()
    out: list[torch.Tensor] = []
    for stream in range(count):
        kept = []
        for end in range(WINDOW, frames + 1):
            audio = codec.decode(codes[stream : stream + 1, :, end - WINDOW : end])[0]
            kept.append(audio[KEPT * hop : (KEPT + 1) * hop])
        out.append(torch.cat(kept) if kept else torch.zeros(0))
    return time.perf_counter() - started, out


def _snr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).pow(2).sum().item()
    signal = reference.pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
