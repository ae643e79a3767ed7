"""``cadenza loadtest``: one level or a sweep, optionally against a baseline server too, then
the report. Load only goes where ``--url`` points; nothing is started here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from cadenza.loadtest.level_runner import Progress, run_level
from cadenza.loadtest.level_summary import level_passes
from cadenza.loadtest.report import build_report, write_report
from cadenza.loadtest.server_metrics import read_capacity
from cadenza.loadtest.sweep import sweep
from cadenza.loadtest.workload import LoadOptions


class LoadTestError(RuntimeError):
    """The target server cannot be tested (unreachable, not ready)."""


async def run_loadtest(
    options: LoadOptions,
    *,
    out_dir: Path,
    concurrency: int | None = None,
    baseline_url: str | None = None,
    start: int = 1,
    limit: int = 128,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[Path]]:
    """Run, write the outputs, return ``(report, paths)``. ``concurrency=None`` sweeps."""
    options = await resolve_target(options)
    before = await _server_capacity(options.url)
    capacity, levels = await _measure(options, concurrency, start, limit, progress)
    after = await _server_capacity(options.url)
    baseline = None
    if baseline_url is not None:
        base_options = await resolve_target(
            replace(options, url=baseline_url.rstrip("/"), model=None, voice=None)
        )
        base_capacity, base_levels = await _measure(base_options, concurrency, 1, limit, progress)
        baseline = {
            "options": _options_dict(base_options),
            "capacity_streams": base_capacity,
            "levels": base_levels,
        }
    report = build_report(
        _options_dict(options),
        levels,
        capacity,
        before.throughput_streams,
        baseline,
        server_claim=(before.claim, after.claim),
        ideal_long_context_streams=before.long_context_throughput_streams,
        realtime_bound=(before.realtime_streams, before.realtime_short_context_streams),
    )
    return report, write_report(report, out_dir)


async def _measure(
    options: LoadOptions,
    concurrency: int | None,
    start: int,
    limit: int,
    progress: Progress | None,
) -> tuple[int | None, list[dict[str, Any]]]:
    await _check_ready(options.url)
    if concurrency is not None:
        level = await run_level(options, concurrency, progress)
        level["passed"] = level_passes(level, options.slo_ttfa_ms)
        return (concurrency if level["passed"] else None), [level]
    return await sweep(options, start=start, limit=limit, progress=progress)


async def resolve_target(options: LoadOptions) -> LoadOptions:
    """``options`` with the model and voice the load goes to, checked against the server's
    ``/v1/models`` (by default its first model, and its ``default`` voice or else its first).
    Raises :class:`LoadTestError` naming what the server has."""
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{options.url}/v1/models", headers=_auth(options))
    except httpx.HTTPError as exc:
        raise LoadTestError(f"{options.url} is unreachable: {exc}") from exc
    if response.status_code != 200:
        raise LoadTestError(f"{options.url}/v1/models answered {response.status_code}")
    served = {m["id"]: list(m.get("voices") or []) for m in response.json().get("data", [])}
    if not served:
        raise LoadTestError(f"{options.url} serves no model")
    model = options.model or next(iter(served))
    if model not in served:
        raise LoadTestError(f"--model {model!r}: the server serves {', '.join(served)}")
    voices = served[model]
    voice = options.voice or ("default" if "default" in voices or not voices else voices[0])
    if voices and voice not in voices:
        raise LoadTestError(f"--voice {voice!r}: {model} has {', '.join(voices)}")
    return replace(options, model=model, voice=voice)


def _auth(options: LoadOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}


async def _check_ready(url: str) -> None:
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{url}/readyz")
    except httpx.HTTPError as exc:
        raise LoadTestError(f"{url} is unreachable: {exc}") from exc
    if response.status_code != 200:
        raise LoadTestError(f"{url}/readyz answered {response.status_code}: not ready")


@dataclass(frozen=True)
class ServerCapacity:
    """What ``/v1/capacity`` says before or after a run (``None``: not reported): the
    server's claim (``max_streams``), and its ``bounds``, none of them admission's figure:
    the engines' saturated throughput in streams, measured in process by their calibration,
    at short contexts and at the long-context point, and the real-time bound, the streams
    whose calibrated step fits one frame period, for nominal and for short streams (summed
    over the replicas, shared cores counted once)."""

    claim: int | None = None
    throughput_streams: float | None = None
    long_context_throughput_streams: float | None = None
    realtime_streams: int | None = None
    realtime_short_context_streams: int | None = None

    @classmethod
    def from_body(cls, capacity: dict[str, Any] | None) -> ServerCapacity:
        """Read a ``/v1/capacity`` body (``None``: none came); malformed fields read as not
        reported."""
        if capacity is None:
            return cls()
        claim = capacity.get("max_streams")
        bounds = capacity.get("bounds")
        bounds = bounds if isinstance(bounds, dict) else {}
        return cls(
            claim=_count(claim),
            throughput_streams=_positive(bounds.get("throughput_streams")),
            long_context_throughput_streams=_positive(
                bounds.get("long_context_throughput_streams")
            ),
            realtime_streams=_count(bounds.get("realtime_streams")),
            realtime_short_context_streams=_count(bounds.get("realtime_short_context_streams")),
        )


async def _server_capacity(url: str) -> ServerCapacity:
    async with httpx.AsyncClient() as client:
        return ServerCapacity.from_body(await read_capacity(client, url))


def _positive(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return float(value) if value > 0 else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _options_dict(options: LoadOptions) -> dict[str, Any]:
    values = asdict(options)
    values["text_lengths"] = f"uniform:{options.text_lengths.low}-{options.text_lengths.high}"
    values.pop("api_key", None)
    return values
