"""A streaming codec decoder at two commits, side by side in one process: the working tree's
``cadenza`` against an earlier commit's, exported next to it as ``cadenza_base`` (as
``engine_ab.py`` does). Same random weights and codes on both sides; their runs alternate
``--rounds`` times, so a machine whose speed drifts slows both alike.

    .venv/bin/python benchmarks/codec_ab.py --base HEAD~1 --codec encodec --streams 16
    .venv/bin/python benchmarks/codec_ab.py --base HEAD~1 --codec encodec --float32
    .venv/bin/python benchmarks/codec_ab.py --base HEAD~1 --codec snac --streams 8 [--noise]
    .venv/bin/python benchmarks/codec_ab.py --base HEAD~1 --codec mimi --streams 8

Every stream decodes 3 s chunk by chunk (the engine's chunk for that codec), all streams in one
call per chunk. Prints each side's median wall time, their ratio, and the largest difference
between the two sides' audio (with ``--noise`` that includes the two sides' noise draws).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_ab import export_as_base

# codec -> (frames in 3 s, frames per chunk); EnCodec decodes in bf16 as served on a CPU with
# bf16 matrix units (``--float32``: in float32), the others in float32 (all they support)
SHAPES = {"encodec": (225, 15), "snac": (35, 2), "mimi": (38, 3)}


def build(
    package: str, codec_name: str, streams: int, float32: bool = False, noise: bool = False
) -> Any:
    """``package``'s streaming decoder for ``codec_name``, random weights from seed 0."""
    codecs = f"{package}.codecs"
    dtype = torch.float32 if float32 else torch.bfloat16
    if codec_name == "encodec":
        codec = importlib.import_module(f"{codecs}.encodec").load_encodec("encodec_24khz", seed=0)
        return codec.streaming_decoder(streams, dtype)
    if codec_name == "snac":
        return (
            importlib.import_module(f"{codecs}.snac")
            .load_snac(noise=noise)
            .streaming_decoder(streams)
        )
    mimi = importlib.import_module(f"{codecs}.mimi")
    from transformers import MimiConfig

    model = mimi.build_random_mimi(MimiConfig(), seed=0)
    importlib.import_module(f"{codecs}.weight_norm").fold_weight_norm(model)
    return mimi.MimiCodec(model, 8).streaming_decoder(streams)


def run_once(decoder: Any, codes: torch.Tensor, chunk: int) -> tuple[float, list[torch.Tensor]]:
    started = time.perf_counter()
    slots = [decoder.open() for _ in range(codes.shape[0])]
    pieces: list[list[torch.Tensor]] = [[] for _ in slots]
    for start in range(0, codes.shape[-1], chunk):
        out = decoder.decode({s: codes[i, :, start : start + chunk] for i, s in enumerate(slots)})
        for i, s in enumerate(slots):
            pieces[i].append(out[s])
    for i, s in enumerate(slots):
        rest = decoder.close(s)
        if rest is not None:
            pieces[i].append(rest)
    return time.perf_counter() - started, [torch.cat(p, dim=-1) for p in pieces]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--codec", choices=sorted(SHAPES), default="encodec")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--float32", action="store_true", help="EnCodec in float32, not bf16")
    parser.add_argument("--noise", action="store_true", help="SNAC with its noise layers on")
    args = parser.parse_args()
    frames, chunk = SHAPES[args.codec]
    with tempfile.TemporaryDirectory() as scratch:
        export_as_base(args.base, Path(scratch))
        sys.path.insert(0, scratch)
        sides = {
            name: build(name, args.codec, args.streams, args.float32, args.noise)
            for name in ("cadenza_base", "cadenza")
        }
        books = sides["cadenza"].codec
        codes = torch.randint(0, books.codebook_size, (args.streams, books.num_codebooks, frames))
        times: dict[str, list[float]] = {name: [] for name in sides}
        audio: dict[str, list[torch.Tensor]] = {}
        with torch.inference_mode():
            for decoder in sides.values():  # warm-up
                run_once(decoder, codes[:1], chunk)
            for _ in range(args.rounds):
                for name, decoder in sides.items():
                    seconds, audio[name] = run_once(decoder, codes, chunk)
                    times[name].append(seconds)
    base, ours = (statistics.median(times[n]) for n in ("cadenza_base", "cadenza"))
    diff = max(
        float((a.float() - b.float()).abs().max())
        for a, b in zip(audio["cadenza_base"], audio["cadenza"], strict=True)
    )
    print(
        f"{args.codec}, {args.streams} streams x 3 s: {args.base} {base:.3f} s, working tree "
        f"{ours:.3f} s, ratio {base / ours:.2f}, largest audio difference {diff:.2e}"
    )


if __name__ == "__main__":
    main()
