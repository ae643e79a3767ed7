"""The harness's outputs in ``--out``: ``report.json`` (schema in docs/loadtest.md),
``report.md`` (tables) and PNG plots (TTFA percentiles and C100 against concurrency; a
per-stream timeline with underruns marked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_VERSION = 2


def build_report(
    options: dict[str, Any],
    levels: list[dict[str, Any]],
    capacity_streams: int | None,
    ideal_streams: float | None,
    baseline: dict[str, Any] | None = None,
    server_claim: tuple[int | None, int | None] = (None, None),
    ideal_long_context_streams: float | None = None,
    realtime_bound: tuple[int | None, int | None] = (None, None),
) -> dict[str, Any]:
    """``ideal_streams``: the engine's saturated throughput in streams (a bound the server's
    admission does not set), ``ideal_long_context_streams`` the same with every stream at a
    long context; ``realtime_bound``: the server's real-time bound (streams whose calibrated
    step fits one frame period) for nominal and for short streams; ``server_claim``: its
    ``max_streams`` before and after the run."""
    bound, bound_short = realtime_bound
    before, after = server_claim
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "options": options,
        "capacity_streams": capacity_streams,
        "ideal_streams": ideal_streams,
        "capacity_vs_ideal": _ratio(capacity_streams, ideal_streams),
        "ideal_long_context_streams": ideal_long_context_streams,
        "capacity_vs_ideal_long_context": _ratio(capacity_streams, ideal_long_context_streams),
        "realtime_bound_streams": bound,
        "capacity_vs_realtime_bound": _ratio(capacity_streams, bound),
        "realtime_bound_short_context_streams": bound_short,
        "server_max_streams": before,
        "server_max_streams_after": after,
        "claim_vs_capacity": _ratio(before, capacity_streams),
        "claim_after_vs_capacity": _ratio(after, capacity_streams),
        "levels": levels,
    }
    if baseline is not None:
        report["baseline"] = baseline
        base = baseline.get("capacity_streams")
        report["capacity_vs_baseline"] = (
            None if capacity_streams is None or not base else round(capacity_streams / base, 2)
        )
    return report


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every output; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md"]
    paths[0].write_text(json.dumps(report, indent=1) + "\n")
    paths[1].write_text(markdown(report))
    paths += _plots(report, out_dir)
    return paths


def _closed_loop_note(options: dict[str, Any]) -> str:
    """How a closed-loop user asks again and how the users start (empty for other arrivals)."""
    if options.get("arrival") != "closed":
        return ""
    asks = "back to back" if options.get("back_to_back") else "listeners"
    return f" ({asks}, first requests over {options.get('ramp_s')} s)"


def markdown(report: dict[str, Any]) -> str:
    options = report["options"]
    lines = [
        "# cadenza load test",
        "",
        f"Server `{options.get('url')}`, transport `{options.get('transport')}`, arrivals "
        f"`{options.get('arrival')}`{_closed_loop_note(options)}, {options.get('duration_s')} s "
        "per level, SLO: TTFA p95 <= "
        f"{options.get('slo_ttfa_ms')} ms and C100 >= 0.99 (client buffer "
        f"{options.get('client_buffer_ms')} ms).",
        "",
        f"- **capacity at SLO: {report['capacity_streams']} streams**",
        f"- ideal (the engine's saturated throughput, measured in process by its "
        f"calibration): {report['ideal_streams']} streams"
        + (
            f" (capacity / ideal = {report['capacity_vs_ideal']})"
            if report.get("capacity_vs_ideal") is not None
            else ""
        ),
        f"- the same bound with every stream at the calibration's long context: "
        f"{report.get('ideal_long_context_streams')} streams"
        + (
            f" (capacity / that = {report['capacity_vs_ideal_long_context']})"
            if report.get("capacity_vs_ideal_long_context") is not None
            else ""
        ),
        f"- the real-time bound (streams whose calibrated step fits one frame period, no "
        f"margins): {report.get('realtime_bound_streams')} nominal streams"
        + (
            f" (capacity / that = {report['capacity_vs_realtime_bound']})"
            if report.get("capacity_vs_realtime_bound") is not None
            else ""
        )
        + f", {report.get('realtime_bound_short_context_streams')} at short contexts",
        f"- server's claim (`/v1/capacity` max_streams): {report.get('server_max_streams')} "
        f"before the run, {report.get('server_max_streams_after')} after"
        + (
            f" (claim / capacity = {report['claim_vs_capacity']} before, "
            f"{report.get('claim_after_vs_capacity')} after)"
            if report.get("claim_vs_capacity") is not None
            else ""
        ),
    ]
    if "baseline" in report:
        lines.append(
            f"- baseline `{report['baseline']['options'].get('url')}`: "
            f"{report['baseline']['capacity_streams']} streams (cadenza / baseline = "
            f"{report.get('capacity_vs_baseline')})"
        )
    lines += ["", *_level_table(report["levels"])]
    lines += _text_streams(report["levels"])
    lines += _by_node(report["levels"])
    if "baseline" in report:
        lines += ["", "## Baseline", "", *_level_table(report["baseline"]["levels"])]
    return "\n".join(lines) + "\n"


def _level_table(levels: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| streams | offered | admitted | queued | refused | TTFA p50/p95/p99 ms | C50 | C100 "
        "| C200 | RTF p50/p95 | step ms | client CPU | stalls (edge / IPC / client) | pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in levels:
        ttfa = level["ttfa_ms"]
        rtf = level["rtf"]
        server = level.get("server") or {}
        rows.append(
            f"| {level['concurrency']} | {level['offered']} | {level['admitted']} | "
            f"{level['queued']} | {level['rejected']} | {ttfa['p50']} / {ttfa['p95']} / "
            f"{ttfa['p99']} | {level['c50']} | {level['c100']} | {level['c200']} | "
            f"{rtf['p50']} / {rtf['p95']} | {server.get('step_ms_mean')} | "
            f"{level.get('client_cpu')} | {_stalls(level)} | "
            f"{'yes' if level.get('passed') else 'no'} |"
        )
    return rows


def _text_streams(levels: list[dict[str, Any]]) -> list[str]:
    """Segment gaps and last text to end of audio, per level (only for --text-stream runs)."""
    streamed = [level for level in levels if level.get("text_stream")]
    if not streamed:
        return []
    lines = [
        "",
        "## Text streamed in",
        "",
        "| streams | segments | gap between segments p50 / p99 / max ms "
        "| last text to end of audio p50 / p99 ms |",
        "| --- | --- | --- | --- |",
    ]
    for level in streamed:
        text = level["text_stream"]
        gap, end = text["segment_gap_ms"], text["last_text_to_end_ms"]
        lines.append(
            f"| {level['concurrency']} | {text['segments']} | {gap['p50']} / {gap['p99']} / "
            f"{gap['max']} | {end['p50']} / {end['p99']} |"
        )
    return lines


def _by_node(levels: list[dict[str, Any]]) -> list[str]:
    """Admitted streams by the node that served them, per level: only when the run went
    through a front door to more than one node (or named nodes at all)."""
    named = [level for level in levels if set(level.get("admitted_by_node") or {}) - {"unknown"}]
    if not named:
        return []
    lines = ["", "## Admitted streams by node", ""]
    for level in named:
        spread = ", ".join(f"{node} {count}" for node, count in level["admitted_by_node"].items())
        lines.append(f"- {level['concurrency']} streams: {spread}")
    return lines


def _stalls(level: dict[str, Any]) -> str:
    """Waits of 100 ms and more on the audio's way out, by where: the edge's event loop, engine
    outputs the edge read late, and the harness's own loop (with its longest lag); ``-``
    where a server did not report them (not cadenza, or an older one)."""
    server = level.get("server") or {}
    client = level.get("client_loop") or {}

    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    client_part = shown(client.get("stalls"))
    if client.get("max_lag_ms") is not None:
        client_part += f" (max {client['max_lag_ms']} ms)"
    return (
        f"{shown(server.get('edge_loop_stalls'))} / {shown(server.get('delayed_outputs'))} / "
        f"{client_part}"
    )


def _plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    if not levels:
        return []
    paths = []
    x = [level["concurrency"] for level in levels]
    figure, ttfa_axis = plt.subplots(figsize=(7, 4))
    for q, style in (("p50", "-o"), ("p95", "-s"), ("p99", "-^")):
        ttfa_axis.plot(
            x, [level["ttfa_ms"][q] or float("nan") for level in levels], style, label=f"TTFA {q}"
        )
    ttfa_axis.axhline(report["options"].get("slo_ttfa_ms", 500), color="grey", ls="--", lw=1)
    ttfa_axis.set_xlabel("concurrent streams")
    ttfa_axis.set_ylabel("TTFA (ms)")
    c100_axis = ttfa_axis.twinx()
    c100_axis.plot(
        x,
        [level["c100"] if level["c100"] is not None else float("nan") for level in levels],
        "-D",
        color="tab:red",
        label="C100",
    )
    c100_axis.set_ylabel("C100")
    c100_axis.set_ylim(0, 1.05)
    handles = ttfa_axis.get_legend_handles_labels()
    more = c100_axis.get_legend_handles_labels()
    ttfa_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left")
    ttfa_axis.set_title(f"capacity at SLO: {report['capacity_streams']} streams")
    figure.tight_layout()
    path = out_dir / "ttfa_c100.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    paths.append(path)

    level = _timeline_level(report)
    if level is not None:
        figure, axis = plt.subplots(figsize=(8, 4.5))
        for row, stream in enumerate(level["streams"]):
            start = stream["sent_s"]
            color = {"served": "tab:blue", "queued_served": "tab:cyan"}.get(
                stream["outcome"], "tab:grey"
            )
            length = stream["audio_s"] or 0.1
            axis.plot(
                [start, start + (stream["ttfa_ms"] or 0) / 1000 + length],
                [row, row],
                color=color,
                lw=2,
            )
            for at_s, duration_ms in stream["underruns"]:
                axis.plot(
                    [start + at_s, start + at_s + duration_ms / 1000],
                    [row, row],
                    color="tab:red",
                    lw=5,
                )
        axis.set_xlabel("seconds into the level")
        axis.set_ylabel("stream")
        axis.set_title(
            f"{level['concurrency']} concurrent streams: playback (blue), "
            "underruns (red), refused (grey)"
        )
        figure.tight_layout()
        path = out_dir / "underrun_timeline.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def _timeline_level(report: dict[str, Any]) -> dict[str, Any] | None:
    """The first failing level above capacity (where underruns show), else the largest."""
    levels = report["levels"]
    capacity = report["capacity_streams"] or 0
    above = [lv for lv in levels if lv["concurrency"] > capacity]
    return above[0] if above else (levels[-1] if levels else None)
