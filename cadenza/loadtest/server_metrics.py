"""The server's side during a level: ``/v1/capacity`` and ``/metrics`` read over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to ``{sample name: value}``: labelled samples summed per name, except
    histogram buckets, kept per bound as ``name{le=BOUND}``."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_bucket") and "le" in sample.labels:
                name = f"{name}{{le={float(sample.labels['le'])}}}"
            values[name] = values.get(name, 0.0) + float(sample.value)
    return values


async def read_metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    response = await client.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return parse_metrics(response.text)


async def read_capacity(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """``GET /v1/capacity``, or ``None`` when the server has none (or is not cadenza)."""
    try:
        response = await client.get(f"{url}/v1/capacity", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    body = response.json()
    return body if isinstance(body, dict) else None


class MetricsWindow:
    """Server numbers over a level: counters as differences between the first and the last
    scrape, gauges as the mean and maximum of the scrapes."""

    GAUGES = (
        "cadenza_engine_decode_occupancy",
        "cadenza_kv_pages_free",
        "cadenza_streams_admitted",
        "cadenza_capacity_max_streams",
        "cadenza_engine_step_correction",
    )

    def __init__(self) -> None:
        self.scrapes: list[dict[str, float]] = []

    def add(self, values: dict[str, float]) -> None:
        self.scrapes.append(values)

    def summary(self) -> dict[str, Any]:
        if len(self.scrapes) < 2:
            return {}
        first, last = self.scrapes[0], self.scrapes[-1]

        def delta(name: str) -> float:
            return last.get(name, 0.0) - first.get(name, 0.0)

        steps = delta("cadenza_engine_step_seconds_count")
        summary: dict[str, Any] = {
            "steps": int(steps),
            "step_ms_mean": round(1000 * delta("cadenza_engine_step_seconds_sum") / steps, 3)
            if steps
            else None,
            "skipped_steps": int(delta("cadenza_engine_skipped_steps_total")),
            "chunks": int(delta("cadenza_chunk_deadline_slack_seconds_count")),
            "late_chunks": int(delta("cadenza_chunk_deadline_slack_seconds_bucket{le=0.0}")),
            "preemptions": int(delta("cadenza_engine_preemptions_total")),
            # Stalls on the way from the engine to the client (cadenza.loop_lag.STALL_S and up)
            "edge_loop_stalls": int(_over(delta, "cadenza_edge_loop_lag_seconds", 0.1)),
            "delayed_outputs": int(_over(delta, "cadenza_engine_output_delay_seconds", 0.1)),
            "kv_pages_total": last.get("cadenza_kv_pages_total"),
        }
        for name in self.GAUGES:
            series = [s[name] for s in self.scrapes if name in s]
            if series:
                short = name.removeprefix("cadenza_")
                summary[f"{short}_mean"] = round(sum(series) / len(series), 4)
                summary[f"{short}_max"] = round(max(series), 4)
        return summary


def _over(delta: Callable[[str], float], histogram: str, bound: float) -> float:
    """How many of ``histogram``'s observations in the window exceeded ``bound`` (one of its
    bucket bounds): its count less its bucket at ``bound``."""
    return delta(f"{histogram}_count") - delta(f"{histogram}_bucket{{le={float(bound)}}}")
