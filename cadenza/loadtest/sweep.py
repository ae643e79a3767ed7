"""Find ``capacity_streams``: the most concurrent streams at which every offered stream is
admitted, TTFA p95 is within the SLO and C100 >= 0.99 (:func:`level_passes`).

Closed-loop levels: ramp up by doubling from ``start`` until a level fails (or ``limit`` is
reached), then bisect between the last passing and the first failing level.
"""

from __future__ import annotations

from typing import Any

from cadenza.loadtest.level_runner import Progress, run_level
from cadenza.loadtest.level_summary import level_passes
from cadenza.loadtest.workload import LoadOptions


async def sweep(
    options: LoadOptions, start: int = 1, limit: int = 128, progress: Progress | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """``(capacity_streams, levels sorted by concurrency)``; capacity 0 if even ``start``
    fails."""
    levels: dict[int, dict[str, Any]] = {}

    async def passes(concurrency: int) -> bool:
        if concurrency not in levels:
            levels[concurrency] = await run_level(options, concurrency, progress)
        level = levels[concurrency]
        level["passed"] = level_passes(level, options.slo_ttfa_ms)
        return bool(level["passed"])

    low, high = 0, None
    concurrency = max(start, 1)
    while concurrency <= limit:
        if await passes(concurrency):
            low = concurrency
            concurrency *= 2
        else:
            high = concurrency
            break
    if high is None:
        high = limit + 1
        if low < limit and await passes(limit):
            low = limit
    while high - low > 1:
        middle = (low + high) // 2
        if await passes(middle):
            low = middle
        else:
            high = middle
    return low, [levels[c] for c in sorted(levels)]
