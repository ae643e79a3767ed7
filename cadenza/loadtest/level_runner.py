"""Run one load level: offer streams for ``duration_s`` by the chosen arrival process, collect
every stream's result, and read the server's numbers and the harness's own CPU use meanwhile.

Arrival processes:

* ``closed``: ``concurrency`` virtual users, each a listener: it starts its next utterance
  when it has heard the previous one to its end (its simulated playback, not the last chunk's
  arrival, which comes up to the server's lead earlier), so ``concurrency`` streams play at
  once; with ``options.back_to_back`` as soon as the last chunk has arrived instead (a user
  then overlaps two streams while the first plays out); after a refusal it waits 1 s; the
  users' first requests are spread evenly over ``options.ramp_s``;
* ``poisson``: streams arrive at ``rate`` per second (exponential gaps), each on its own
  connection, however many are already running (``concurrency`` caps nothing);
* ``burst``: ``concurrency`` streams start at once, one each.

A level stops offering at ``duration_s`` and waits for the streams in flight to finish. The
harness's own event loop is watched meanwhile (:class:`cadenza.loop_lag.LoopLagProbe`): a gap
in a stream's audio while that loop stalled may be the harness's, not the server's. With
``options.chaos``, engine replicas are killed on that schedule meanwhile
(:mod:`cadenza.loadtest.chaos`) and the level gets a ``chaos`` entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from cadenza.client.sdk import Session, StreamError, connect
from cadenza.gc_pauses import full_collections_deferred
from cadenza.loadtest.chaos import Kill, run_chaos, summarize_chaos
from cadenza.loadtest.clients import http_stream, webrtc_stream, ws_stream
from cadenza.loadtest.level_summary import StreamResult, summarize_level
from cadenza.loadtest.server_metrics import MetricsWindow, read_capacity, read_metrics
from cadenza.loadtest.workload import LoadOptions
from cadenza.loop_lag import LoopLagProbe

Progress = Callable[[str], None]
SCRAPE_INTERVAL_S = 1.0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_level(
    options: LoadOptions, concurrency: int, progress: Progress | None = None
) -> dict[str, Any]:
    """One level's ``levels[]`` entry (see :func:`summarize_level`). The clients' arrival
    times are the measurement: the level runs with this process's full garbage collections
    put off to its end (:func:`cadenza.gc_pauses.full_collections_deferred`)."""
    with full_collections_deferred():
        return await _run_level(options, concurrency, progress)


async def _run_level(
    options: LoadOptions, concurrency: int, progress: Progress | None
) -> dict[str, Any]:
    rng = random.Random(options.seed * 1_000_003 + concurrency)
    results: list[StreamResult] = []
    window = MetricsWindow()
    start = time.monotonic()
    cpu_start = _cpu_seconds()
    stop_offering = start + options.duration_s
    loop_lag = LoopLagProbe("load tester")
    probe = loop_lag.start()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30)) as http:
        capacity = await read_capacity(http, options.url)
        scraper = asyncio.create_task(_scrape(http, options.url, window))
        reporter = asyncio.create_task(_report(progress, concurrency, results, start, options))
        chaos: asyncio.Task[list[Kill]] | None = None
        if options.chaos is not None:
            chaos = asyncio.create_task(
                run_chaos(
                    http, options.url, options.api_key, options.chaos, rng, start, stop_offering
                )
            )
        try:
            if options.arrival == "closed":
                await asyncio.gather(
                    *(
                        _virtual_user(
                            options,
                            http,
                            rng.random(),
                            user / concurrency,
                            start,
                            stop_offering,
                            results,
                        )
                        for user in range(concurrency)
                    )
                )
            else:
                await _open_arrivals(options, http, concurrency, rng, start, results)
            kills = [] if chaos is None else await chaos
        finally:
            if chaos is not None:
                chaos.cancel()
            probe.cancel()
            reporter.cancel()
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
            with contextlib.suppress(httpx.HTTPError):
                window.add(await read_metrics(http, options.url))
    wall = time.monotonic() - start
    server = window.summary()
    if capacity is not None:
        server["max_streams_at_start"] = capacity.get("max_streams")
    level = summarize_level(
        concurrency,
        results,
        server=server,
        client_cpu=round((_cpu_seconds() - cpu_start) / wall, 3) if wall > 0 else None,
        client_loop={"max_lag_ms": round(1000 * loop_lag.max_lag_s, 1), "stalls": loop_lag.stalls},
        duration_s=wall,
        slo_underrun_ms=options.slo_underrun_ms,
    )
    if options.chaos is not None:
        level["chaos"] = summarize_chaos(kills, results)
    return level


async def _virtual_user(
    options: LoadOptions,
    http: httpx.AsyncClient,
    seed: float,
    ramp_share: float,
    start: float,
    stop_offering: float,
    results: list[StreamResult],
) -> None:
    """One closed-loop user: its first request ``ramp_share`` of ``options.ramp_s`` after
    the level starts, then one utterance after another until ``stop_offering``."""
    rng = random.Random(seed)
    await asyncio.sleep(ramp_share * options.ramp_s)
    if options.transport != "ws":
        runner = (
            _http_runner(http, options) if options.transport == "http" else _webrtc_runner(options)
        )
        await _loop(options, rng, start, stop_offering, results, runner)
        return
    while True:  # one connection per virtual user, reused across its utterances
        try:
            async with connect(options.ws_url, api_key=options.api_key, open_timeout=30) as session:
                runner = _ws_runner(session, options)
                await _loop(options, rng, start, stop_offering, results, runner)
            return
        except _SessionLost as lost:  # its node was lost and the utterance could not resume
            results.append(lost.result)
        except (OSError, StreamError) as exc:
            results.append(_connection_error(exc, start))
            return


def _connection_error(exc: BaseException, start: float) -> StreamResult:
    return StreamResult("error", time.monotonic() - start, reason=str(exc)[:80])


Runner = Callable[[str, float, int], Awaitable[StreamResult]]


class _SessionLost(Exception):
    """The session's connection closed under an utterance (that could not resume): the
    virtual user connects again."""

    def __init__(self, result: StreamResult) -> None:
        super().__init__(result.reason)
        self.result = result


def _ws_runner(session: Session, options: LoadOptions) -> Runner:
    async def run(text: str, start: float, seed: int) -> StreamResult:
        result = await ws_stream(session, text, options, start, seed)
        if result.reason == "connection_lost":
            raise _SessionLost(result)
        return result

    return run


def _http_runner(http: httpx.AsyncClient, options: LoadOptions) -> Runner:
    return lambda text, start, seed: http_stream(http, text, options, start, seed)


def _webrtc_runner(options: LoadOptions) -> Runner:
    return lambda text, start, seed: webrtc_stream(text, options, start)


async def _loop(
    options: LoadOptions,
    rng: random.Random,
    start: float,
    stop_offering: float,
    results: list[StreamResult],
    runner: Runner,
) -> None:
    while time.monotonic() < stop_offering:
        result = await runner(options.text_lengths.sample(rng), start, rng.randrange(2**31))
        results.append(result)
        if result.outcome in ("refused", "error"):
            await asyncio.sleep(1.0)
        elif result.playout is not None and not options.back_to_back:
            await asyncio.sleep(max(result.playout.ends_s - time.monotonic(), 0.0))


async def _open_arrivals(
    options: LoadOptions,
    http: httpx.AsyncClient,
    concurrency: int,
    rng: random.Random,
    start: float,
    results: list[StreamResult],
) -> None:
    async def one(seed: int) -> None:
        text = options.text_lengths.sample(random.Random(seed))
        if options.transport == "ws":  # a connection of its own
            try:
                async with connect(options.ws_url, api_key=options.api_key, open_timeout=30) as s:
                    results.append(await ws_stream(s, text, options, start, seed))
            except (OSError, StreamError) as exc:
                results.append(_connection_error(exc, start))
        elif options.transport == "http":
            results.append(await http_stream(http, text, options, start, seed))
        else:
            results.append(await webrtc_stream(text, options, start))

    tasks: list[asyncio.Task[None]] = []
    if options.arrival == "burst":
        tasks = [asyncio.create_task(one(rng.randrange(2**31))) for _ in range(concurrency)]
    else:
        while time.monotonic() - start < options.duration_s:
            tasks.append(asyncio.create_task(one(rng.randrange(2**31))))
            await asyncio.sleep(rng.expovariate(options.rate))
    await asyncio.gather(*tasks)


async def _scrape(http: httpx.AsyncClient, url: str, window: MetricsWindow) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            window.add(await read_metrics(http, url))
        await asyncio.sleep(SCRAPE_INTERVAL_S)


async def _report(
    progress: Progress | None,
    concurrency: int,
    results: list[StreamResult],
    start: float,
    options: LoadOptions,
) -> None:
    if progress is None:
        return
    while True:
        elapsed = time.monotonic() - start
        done = min(elapsed / options.duration_s, 1.0)
        bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
        refused = sum(1 for r in results if r.outcome == "refused")
        progress(
            f"level {concurrency:>3} [{bar}] {elapsed:5.1f}s  streams {len(results):>4}  "
            f"refused {refused:>3}"
        )
        await asyncio.sleep(0.5)
