"""One load level's numbers: per-stream results in, the ``levels[]`` entry of report.json out.

Definitions (docs/loadtest.md):

* *offered*: streams the harness started; *admitted*: streams that produced audio (at once or
  after waiting); *queued*: admitted streams that waited for capacity first; *rejected*: refused
  by the server, by reason; *errors*: anything else that went wrong.
* TTFA: request sent to first audio received, queue wait included (what the user waits);
  ``ttfa_admitted_ms`` excludes the wait.
* ``cX``: share of admitted streams whose longest underrun stays under X ms; ``c_slo`` the same
  at the run's ``--slo-underrun-ms`` (100 ms by default, so equal to ``c100``).
* RTF: time from first to last chunk over the audio's duration (below 1: faster than real time).
* ``admitted_by_node``: admitted streams by the node that served them (its ``x-cadenza-node``
  header, or the WebSocket greeting's ``node``): how a front door spread the load.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cadenza.loadtest.playout import Playout


@dataclass
class StreamResult:
    outcome: str  # "served", "queued_served", "refused", "error"
    sent_s: float  # relative to the level's start
    reason: str | None = None
    queued_s: float = 0.0
    ttfa_s: float | None = None  # from the request, queue wait included
    playout: Playout | None = None
    broken: bool = False  # an error after the stream's audio had started
    node: str | None = None  # the node that answered (x-cadenza-node, or the greeting's node)
    resumed: bool = False  # its connection or node was lost and it went on elsewhere
    resume_gap_s: float | None = None  # from the loss to the first audio after it
    # Text streams (--text-stream): the listener's wait at each segment after the first, and
    # from the last text sent to the end of the audio heard.
    segment_gaps_s: tuple[float, ...] = ()
    text_to_end_s: float | None = None

    @property
    def admitted(self) -> bool:
        return self.outcome in ("served", "queued_served")

    @property
    def rtf(self) -> float | None:
        if self.playout is None or self.playout.audio_s <= 0:
            return None
        return self.playout.generation_s / self.playout.audio_s


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(q / 100.0 * len(ordered)), 1)
    return ordered[rank - 1]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000.0 * value, 1)


def share_under(results: list[StreamResult], limit_s: float) -> float | None:
    played = [r for r in results if r.admitted and r.playout is not None]
    if not played:
        return None
    assert all(r.playout is not None for r in played)
    ok = sum(1 for r in played if r.playout and r.playout.longest_underrun_s < limit_s)
    return round(ok / len(played), 4)


def summarize_level(
    concurrency: int,
    results: list[StreamResult],
    *,
    server: dict[str, Any] | None = None,
    client_cpu: float | None = None,
    client_loop: dict[str, Any] | None = None,
    duration_s: float = 0.0,
    slo_underrun_ms: float = 100.0,
) -> dict[str, Any]:
    admitted = [r for r in results if r.admitted]
    ttfa = [r.ttfa_s for r in admitted if r.ttfa_s is not None]
    ttfa_admitted = [r.ttfa_s - r.queued_s for r in admitted if r.ttfa_s is not None]
    rtf = [x for x in (r.rtf for r in admitted) if x is not None]
    rejected = Counter(r.reason or "unknown" for r in results if r.outcome == "refused")
    errors = Counter(r.reason or "unknown" for r in results if r.outcome == "error")
    return {
        "concurrency": concurrency,
        "duration_s": round(duration_s, 2),
        "offered": len(results),
        "admitted": len(admitted),
        "queued": sum(1 for r in results if r.outcome == "queued_served"),
        "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(rejected),
        "errors": sum(errors.values()),
        "errors_by_reason": dict(errors),
        "ttfa_ms": {f"p{q}": _ms(percentile(ttfa, q)) for q in (50, 95, 99)},
        "ttfa_admitted_ms": {f"p{q}": _ms(percentile(ttfa_admitted, q)) for q in (50, 95, 99)},
        "c50": share_under(results, 0.050),
        "c100": share_under(results, 0.100),
        "c200": share_under(results, 0.200),
        "slo_underrun_ms": slo_underrun_ms,
        "c_slo": share_under(results, slo_underrun_ms / 1000.0),
        "rtf": {f"p{q}": _round(percentile(rtf, q)) for q in (50, 95)},
        "audio_s": round(sum(r.playout.audio_s for r in admitted if r.playout), 2),
        "admitted_by_node": dict(sorted(Counter(r.node or "unknown" for r in admitted).items())),
        "text_stream": _text_stream_summary(admitted),
        "server": server or {},
        "client_cpu": client_cpu,
        "client_loop": client_loop or {},
        "streams": [_stream_entry(r) for r in sorted(results, key=lambda r: r.sent_s)],
    }


def _text_stream_summary(admitted: list[StreamResult]) -> dict[str, Any] | None:
    """Text streams' segment gaps (every segment after a stream's first, in ms: p50, p99,
    max) and time from the last text to the end of the audio (``None``: no text streams)."""
    ends = [r.text_to_end_s for r in admitted if r.text_to_end_s is not None]
    if not ends:
        return None
    gaps = [gap for r in admitted for gap in r.segment_gaps_s]
    return {
        "segments": len(gaps) + len(ends),
        "segment_gap_ms": {
            "p50": _ms(percentile(gaps, 50)),
            "p99": _ms(percentile(gaps, 99)),
            "max": _ms(max(gaps, default=None)),
        },
        "last_text_to_end_ms": {f"p{q}": _ms(percentile(ends, q)) for q in (50, 99)},
    }


def _stream_entry(result: StreamResult) -> dict[str, Any]:
    playout = result.playout
    return {
        "sent_s": round(result.sent_s, 3),
        "outcome": result.outcome,
        "reason": result.reason,
        "node": result.node,
        "resumed": result.resumed,
        "resume_gap_ms": _ms(result.resume_gap_s),
        "broken": result.broken,
        "queued_ms": _ms(result.queued_s),
        "ttfa_ms": _ms(result.ttfa_s),
        "audio_s": None if playout is None else round(playout.audio_s, 3),
        "generation_s": None if playout is None else round(playout.generation_s, 3),
        "longest_underrun_ms": None if playout is None else _ms(playout.longest_underrun_s),
        "underruns": []
        if playout is None
        else [[round(u.at_s, 3), _ms(u.duration_s)] for u in playout.underruns],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def level_passes(level: dict[str, Any], slo_ttfa_ms: float, min_share: float = 0.99) -> bool:
    """Every offered stream admitted, TTFA p95 within the SLO, and at least ``min_share`` of the
    streams with no underrun as long as the level's ``slo_underrun_ms`` (C100 by default)."""
    if level["offered"] == 0 or level["admitted"] < level["offered"]:
        return False
    p95 = level["ttfa_ms"]["p95"]
    share = level["c_slo"]
    return p95 is not None and p95 <= slo_ttfa_ms and share is not None and share >= min_share
