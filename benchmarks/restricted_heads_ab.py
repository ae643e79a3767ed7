"""An Orpheus-shaped engine's decode step with its head restricted to the ids a token position
may emit (4,097 of 156,940 logits) and with the full head, side by side in one process.

    .venv/bin/python benchmarks/restricted_heads_ab.py --shape small --streams 1,4,8 --rounds 5

The engine (random weights in the Orpheus layout, SNAC 24 kHz decoding every stream's audio)
holds ``--streams`` streams, settled 30 steps; then it alternates the two heads ``--rounds``
times, 28 steps each (four SNAC frames). Reported per stream count: the median over rounds of
the median step, in milliseconds, for each head, and full / restricted. Greedy tokens of both
heads over the same prompts are compared too (they must be equal: the restricted head computes
the same products for the ids it keeps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from orpheus_streams import build_checkpoint

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.restricted_heads import RestrictedHeads

SETTLE_STEPS = 30
ROUND_STEPS = 28


def _set_head(engine: Engine, heads: RestrictedHeads | None) -> None:
    engine.model.output_heads = heads  # type: ignore[assignment]


def _median_steps(engine: Engine, steps: int) -> float:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def side_by_side(engine: Engine, streams: int, rounds: int) -> dict[str, float]:
    restricted = engine.model.restricted_outputs
    assert isinstance(restricted, RestrictedHeads), "the model's head is not restricted"
    for i in range(streams):
        text = f"Stream {i} is reading a sentence of moderate length aloud for the benchmark."
        engine.add_request(
            SynthesisRequest(f"s{streams}-{i}", text, "tara", 30.0, engine.model.default_sampling)
        )
    _median_steps(engine, SETTLE_STEPS)
    medians: dict[str, list[float]] = {"restricted": [], "full": []}
    for _ in range(rounds):
        for name, heads in (("restricted", restricted), ("full", None)):
            _set_head(engine, heads)
            medians[name].append(_median_steps(engine, ROUND_STEPS))
    _set_head(engine, restricted)
    for i in range(streams):
        engine.abort_request(f"s{streams}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    result = {name: statistics.median(values) for name, values in medians.items()}
    return result | {"ratio": result["full"] / result["restricted"]}


def greedy_tokens_agree(engine: Engine) -> bool:
    restricted = engine.model.restricted_outputs
    greedy = SamplingParams(temperature=0.0, top_k=0)
    tokens = {}
    for name, heads in (("restricted", restricted), ("full", None)):
        _set_head(engine, heads)
        for i in range(3):
            engine.add_request(
                SynthesisRequest(f"{name}{i}", f"Hello number {i}.", "tara", 1.0, greedy)
            )
        rows = {f"{name}{i}": engine.sequence(f"{name}{i}") for i in range(3)}
        assert all(seq is not None for seq in rows.values())
        while engine.has_unfinished_requests():
            engine.step()
        tokens[name] = [[row[0] for row in seq.output_rows] for seq in rows.values() if seq]
    _set_head(engine, restricted)
    return tokens["restricted"] == tokens["full"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["cpu", "small", "3b"], default="small")
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        build_checkpoint(Path(directory), args.shape, "cpu", torch.float32)
        engine = Engine.from_pretrained(directory, codec="snac_24khz", codec_noise=False)
        print(f"greedy tokens equal with both heads: {greedy_tokens_agree(engine)}")
        print("| streams | restricted head (ms) | full head (ms) | full / restricted |")
        print("|---|---|---|---|")
        for streams in (int(n) for n in args.streams.split(",")):
            row = side_by_side(engine, streams, args.rounds)
            print(
                f"| {streams} | {row['restricted']:.2f} | {row['full']:.2f} | {row['ratio']:.2f} |"
            )


if __name__ == "__main__":
    main()
