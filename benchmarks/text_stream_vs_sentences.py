"""Text that arrives at a language model's pace, spoken two ways on the same server in one run:
cadenza's text streams (one ``speak`` with ``text_stream``, the text sent token by token) and
one ``speak`` per sentence (the client gathers tokens into sentences, as voice-agent frameworks
do, and speaks each once the previous one is done and the sentence is complete).

Each of ``--streams`` virtual users (default: half the server's claimed capacity) answers in
``--sentences`` sentences, its tokens arriving at ``--tokens-per-s``, one answer after another
for ``--seconds``; the two ways alternate for ``--rounds`` rounds. A listener plays everything
a user hears in one sequence (a 100 ms buffer first, as the load tester's); reported per way:
the gap between sentences or segments (the listener's silence before each one after the
first: p50, p99, max), underruns inside them, and the time from the first token to the first
audio (p50, p95).

    .venv/bin/python benchmarks/text_stream_vs_sentences.py --out /tmp/text-vs-sentences

Starts its own server (or measures ``--url``); writes ``summary.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from cluster_vs_node import Node

from cadenza.client import StreamError, connect
from cadenza.client.sdk import Session
from cadenza.loadtest.level_summary import percentile
from cadenza.loadtest.playout import Chunk, simulate_playout
from cadenza.loadtest.workload import TextLengths, as_sentences, llm_tokens

CLIENT_BUFFER_S = 0.1


@dataclass
class Answer:
    """What one answer sounded like: its chunks, where each sentence or segment after the
    first began, and when its first token was sent."""

    first_token_s: float
    chunks: list[Chunk] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    refused: str | None = None  # the error that refused or ended it

    def measures(self) -> tuple[list[float], float, float | None]:
        """Gaps before each later sentence, the longest wait inside them, first token to
        first audio."""
        if not self.chunks:
            return [], 0.0, None
        playout = simulate_playout(self.chunks, CLIENT_BUFFER_S, self.first_token_s)
        gaps = [playout.starved_s[i] for i in self.starts]
        inside = [s for i, s in enumerate(playout.starved_s) if i not in set(self.starts)]
        return gaps, max(inside, default=0.0), self.chunks[0].arrival_s - self.first_token_s


async def tokens(text: str, per_s: float, start: float) -> AsyncIterator[str]:
    """The language model's tokens: token ``i`` exists at ``start + i / per_s`` (a reader that
    comes later finds it waiting, as a model's output waits in its stream)."""
    for index, token in enumerate(llm_tokens(text)):
        await asyncio.sleep(max(start + index / per_s - time.monotonic(), 0.0))
        yield token


async def streamed(session: Session, text: str, per_s: float, seed: int) -> Answer:
    answer = Answer(time.monotonic())
    async for chunk in session.speak_stream(tokens(text, per_s, answer.first_token_s), seed=seed):
        if chunk.segment and chunk.segment > len(answer.starts):
            answer.starts.append(len(answer.chunks))
        answer.chunks.append(Chunk(time.monotonic(), len(chunk.data) / 2 / chunk.sample_rate))
    return answer


async def sentence_by_sentence(session: Session, text: str, per_s: float, seed: int) -> Answer:
    sentences: asyncio.Queue[str | None] = asyncio.Queue()

    async def gather() -> None:
        pending = ""
        async for token in tokens(text, per_s, answer.first_token_s):
            pending += token
            if pending.rstrip().endswith((".", "!", "?")):
                await sentences.put(pending.strip())
                pending = ""
        if pending.strip():
            await sentences.put(pending.strip())
        await sentences.put(None)

    answer = Answer(time.monotonic())
    gathering = asyncio.ensure_future(gather())
    try:
        while (sentence := await sentences.get()) is not None:
            if answer.chunks:
                answer.starts.append(len(answer.chunks))
            async for chunk in session.speak(sentence, seed=seed):
                rate = chunk.sample_rate
                answer.chunks.append(Chunk(time.monotonic(), len(chunk.data) / 2 / rate))
    finally:
        gathering.cancel()
    return answer


async def run_way(url: str, way: str, args: argparse.Namespace, seed: int) -> list[Answer]:
    speak = streamed if way == "text_stream" else sentence_by_sentence
    lengths = TextLengths(12 * 6 * args.sentences, 12 * 6 * args.sentences)
    deadline = time.monotonic() + args.seconds
    answers: list[Answer] = []

    async def user(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        await asyncio.sleep(index * 0.2)
        async with connect(url.replace("http", "ws", 1) + "/v1/stream") as session:
            while time.monotonic() < deadline:
                text = as_sentences(lengths.sample(rng))
                try:
                    answers.append(
                        await speak(session, text, args.tokens_per_s, rng.randrange(2**31))
                    )
                except StreamError as exc:  # refused (at capacity) or failed: counted
                    answers.append(Answer(time.monotonic(), refused=exc.code))
                    await asyncio.sleep(1.0)

    await asyncio.gather(*(user(i) for i in range(args.streams)))
    return answers


def summarize(answers: list[Answer]) -> dict[str, Any]:
    gaps: list[float] = []
    inside: list[float] = []
    first: list[float] = []
    for answer in answers:
        if answer.refused is not None:
            continue
        answer_gaps, longest_inside, first_audio = answer.measures()
        gaps += answer_gaps
        inside.append(longest_inside)
        if first_audio is not None:
            first.append(first_audio)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(1000 * value, 1)

    refused = Counter(a.refused for a in answers if a.refused is not None)
    return {
        "answers": len(answers) - sum(refused.values()),
        "refused_or_failed": dict(refused),
        "later_sentences": len(gaps),
        "gap_ms": {
            "p50": ms(percentile(gaps, 50)),
            "p99": ms(percentile(gaps, 99)),
            "max": ms(max(gaps, default=None)),
        },
        "gaps_over_20ms": sum(1 for gap in gaps if gap > 0.02),
        "longest_underrun_inside_ms": ms(max(inside, default=None)),
        "first_token_to_audio_ms": {
            "p50": ms(percentile(first, 50)),
            "p95": ms(percentile(first, 95)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--streams", type=int, help="users at once (default: half the claim)")
    parser.add_argument("--sentences", type=int, default=4, help="sentences per answer")
    parser.add_argument("--tokens-per-s", type=float, default=40.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="per way and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    node = None
    if args.url is None:
        cache = Path(tempfile.mkdtemp(prefix="cadenza-calibration-"))
        node = Node("text-vs-sentences", args.out, cache, replicas=1)
        node.wait_ready()
        args.url = node.url
    try:
        claim = httpx.get(f"{args.url}/v1/capacity", timeout=10).json()
        max_streams = int(claim.get("max_streams") or 2)
        args.streams = args.streams or max(max_streams // 2, 1)
        ways: dict[str, list[Answer]] = {"text_stream": [], "per_sentence": []}
        for round_index in range(args.rounds):
            order = list(ways) if round_index % 2 == 0 else list(reversed(ways))
            for way in order:
                ways[way] += asyncio.run(run_way(args.url, way, args, seed=round_index))
        summary = {
            "server_max_streams": max_streams,
            "streams": args.streams,
            "sentences_per_answer": args.sentences,
            "tokens_per_s": args.tokens_per_s,
            "seconds_per_way_and_round": args.seconds,
            "rounds": args.rounds,
            **{way: summarize(answers) for way, answers in ways.items()},
        }
    finally:
        if node is not None:
            node.stop()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
