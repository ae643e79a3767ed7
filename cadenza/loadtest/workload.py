"""What the harness asks for: text lengths, arrival processes, and the options of one run."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cadenza.loadtest.chaos import ChaosSchedule

Transport = Literal["ws", "http", "webrtc"]
Arrival = Literal["closed", "poisson", "burst"]

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "bright",
    "violins",
    "tune",
    "their",
    "strings",
    "and",
    "the",
    "river",
    "keeps",
    "singing",
    "softly",
    "under",
    "an",
    "old",
    "stone",
    "bridge",
    "near",
    "the",
    "quiet",
    "market",
    "square",
]


class WorkloadError(ValueError):
    """A workload option is malformed."""


@dataclass(frozen=True)
class TextLengths:
    """Characters per utterance, uniform in ``[low, high]``."""

    low: int
    high: int

    @classmethod
    def parse(cls, spec: str) -> TextLengths:
        """``fixed:N`` or ``uniform:A-B`` (characters)."""
        kind, _, value = spec.partition(":")
        try:
            if kind == "fixed":
                low = high = int(value)
            elif kind == "uniform":
                a, _, b = value.partition("-")
                low, high = int(a), int(b)
            else:
                raise ValueError
        except ValueError:
            raise WorkloadError(
                f"text lengths {spec!r}: expected fixed:N or uniform:A-B (characters)"
            ) from None
        if not 1 <= low <= high:
            raise WorkloadError(f"text lengths {spec!r}: need 1 <= A <= B")
        return cls(low, high)

    def sample(self, rng: random.Random) -> str:
        target = rng.randint(self.low, self.high)
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < target:
            words.append(rng.choice(_WORDS))
        return " ".join(words)[:target].strip() or "hello"


@dataclass(frozen=True)
class LoadOptions:
    url: str  # http://host:port of the server
    transport: Transport = "ws"
    arrival: Arrival = "closed"
    rate: float = 1.0  # poisson: streams per second
    duration_s: float = 20.0  # how long each level offers new streams
    text_lengths: TextLengths = TextLengths(40, 120)
    slo_ttfa_ms: float = 500.0
    slo_underrun_ms: float = 100.0
    client_buffer_ms: float = 100.0
    priority: str = "realtime"
    api_key: str | None = None
    seed: int = 0
    chaos: ChaosSchedule | None = None  # kill a random engine replica on this schedule
    model: str | None = None  # the served model to load (None: the server's first)
    voice: str | None = None  # its voice (None: "default" if it has one, else its first)
    # closed: the next utterance as soon as the last chunk arrives, not after playback
    back_to_back: bool = False
    # closed: the users' first requests spread evenly over this many seconds
    ramp_s: float = 0.25
    # the audio each utterance asks for at most (None: what its text takes to say)
    max_duration_s: float | None = None
    # ws: stream each utterance's text in at this many tokens per second, as a language model
    # would (None: send it whole)
    text_stream_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise WorkloadError(f"--url {self.url!r}: expected http://host:port")
        for name, value, minimum in (
            ("--rate", self.rate, 0.0),
            ("--duration", self.duration_s, 0.0),
            ("--slo-ttfa-ms", self.slo_ttfa_ms, 0.0),
            ("--slo-underrun-ms", self.slo_underrun_ms, 0.0),
        ):
            if not value > minimum:
                raise WorkloadError(f"{name} must be positive, got {value}")
        if self.client_buffer_ms < 0:
            raise WorkloadError(f"--client-buffer-ms must be >= 0, got {self.client_buffer_ms}")
        if self.text_stream_tokens_per_s is not None:
            if not self.text_stream_tokens_per_s > 0:
                raise WorkloadError(
                    f"--text-stream must be positive, got {self.text_stream_tokens_per_s}"
                )
            if self.transport != "ws":
                raise WorkloadError("--text-stream needs --transport ws")
        if not 0 <= self.ramp_s < self.duration_s:
            raise WorkloadError(
                f"--ramp-s must be >= 0 and below --duration ({self.duration_s}), got {self.ramp_s}"
            )

    @property
    def ws_url(self) -> str:
        return (
            self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1).rstrip("/")
            + "/v1/stream"
        )


def as_sentences(text: str, words_per_sentence: int = 12) -> str:
    """``text`` with a period after every ``words_per_sentence`` words and at its end, as a
    language model's answer has (the workload's words have no punctuation)."""
    words = text.split()
    sentences = [
        " ".join(words[start : start + words_per_sentence]) + "."
        for start in range(0, len(words), words_per_sentence)
    ]
    return " ".join(sentence[:1].upper() + sentence[1:] for sentence in sentences)


def llm_tokens(text: str, chars_per_token: int = 4) -> list[str]:
    """``text`` in the pieces a language model streams: each word with the space before it,
    long words cut into ``chars_per_token``-character pieces."""
    tokens: list[str] = []
    for index, word in enumerate(text.split(" ")):
        piece = word if index == 0 else " " + word
        tokens += [piece[i : i + chars_per_token] for i in range(0, len(piece), chars_per_token)]
    return [token for token in tokens if token]
