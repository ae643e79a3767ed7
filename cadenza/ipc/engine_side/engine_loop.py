"""The engine process's busy loop around a :class:`ServingEngine`, fed over ZeroMQ.

Run as its own process (``python -m cadenza.ipc.engine_side``, started by
:class:`~cadenza.ipc.edge_side.engine_client.EngineClient`) or, for tests and offline use, in a
thread of the caller's process with ``inproc://`` sockets. The edge binds both sockets; the engine
connects.

While it loads and calibrates, a thread sends ``starting`` every ``STARTUP_REPORT_S`` (what it
does, how much CPU time it has used), which the edge's start deadline follows: a calibration
slowed down by a busy neighbour is waited for, a stuck start is not.

Loop: drain every waiting message (block briefly when idle, or until the first stream needs a
step when every stream is far enough ahead of its listener), run one engine step, send its
outputs, and every ``STATS_INTERVAL_S`` a ``stats`` message that doubles as the heartbeat the
edge's readiness check watches. An engine serving with a conservative calibration measures
again once idle for ``calibration.remeasure_idle_s`` (:mod:`cadenza.engine.realtime.remeasure`):
anything arriving stops that sweep at its next step, and one that agrees with itself goes to
the edge as ``recalibrated``. A request the engine refuses (or fails to add) gets a final
``output`` with ``error_code = "rejected"``; a step that raises outside the engine's per-request
isolation ends the loop with ``fatal``. Every message a step produces is sent before the next step
starts, so cancellations reach the engine between steps and pages are only released when no
step is using them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import zmq

from cadenza.config import CadenzaConfig
from cadenza.contract import messages
from cadenza.contract.engine_stats import STATS_INTERVAL_S, StepReport
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import FinishReason, StreamOutput
from cadenza.engine.serving_engine import ServingEngine

if TYPE_CHECKING:
    from cadenza.engine.engine import Engine
    from cadenza.engine.realtime.remeasure import RemeasureSchedule

log = logging.getLogger(__name__)

IDLE_POLL_MS = 100
STARTUP_REPORT_S = 1.0
EDGE_GONE_AFTER_S = 30.0
MAX_LEAD_POLL_MS = 20  # streams far ahead: look again this soon (stats keep their pace)


def run_engine_loop(
    config: CadenzaConfig,
    context: zmq.Context[zmq.Socket[bytes]],
    inbound_address: str,
    outbound_address: str,
    stop: threading.Event | None = None,
    after_load: Callable[[], None] | None = None,
    place: Callable[[CadenzaConfig], CadenzaConfig] | None = None,
) -> None:
    """Load the model, announce ``ready``, then serve until ``shutdown`` (or ``stop`` is set).
    ``place`` decides where the engine runs and the configuration it runs with, first (an
    engine in its own process: :func:`~cadenza.ipc.engine_side.replica_placement.
    place_replica`, before torch is imported), while its start is already reported.
    ``after_load`` runs once the engine has loaded, before ``ready`` (an engine in its own
    process settles its heap there: :func:`cadenza.gc_pauses.settle_after_loading`)."""
    inbound = context.socket(zmq.PULL)
    outbound = context.socket(zmq.PUSH)
    # A send the edge does not take for this long means the edge is gone: give up (and exit)
    # instead of blocking forever, e.g. on the ``ready`` of an engine whose edge went away
    # while it loaded.
    outbound.setsockopt(zmq.SNDTIMEO, int(1000 * EDGE_GONE_AFTER_S))
    inbound.connect(inbound_address)
    outbound.connect(outbound_address)
    try:
        try:
            with _StartupReports(outbound) as reports:
                if place is not None:
                    config = place(config)
                from cadenza.engine.builder import build_serving_engine  # torch: this process

                engine = build_serving_engine(config, on_stage=reports.set_stage)
        except Exception as exc:
            log.exception("engine failed to load")
            outbound.send(messages.encode(messages.Fatal(f"engine failed to load: {exc}")))
            return
        if after_load is not None:
            after_load()
        outbound.send(messages.encode(messages.Ready(engine.info)))
        try:
            _serve(engine, inbound, outbound, stop, config.calibration.remeasure_idle_s)
        except Exception as exc:  # a step that failed outside per-request isolation
            log.exception("engine failed")
            outbound.send(messages.encode(messages.Fatal(f"engine failed: {exc}")))
    finally:
        inbound.close(linger=0)
        outbound.close(linger=1000)


class _StartupReports:
    """While the engine starts (the ``with`` block), a thread sends ``starting`` on
    ``outbound`` at once and every ``STARTUP_REPORT_S``: the stage set last, and the CPU
    time this process has used (:func:`_cpu_s`). Nothing else sends on ``outbound``
    meanwhile (a ZeroMQ socket is used by one thread at a time; the block's end joins the
    thread before the loop sends again)."""

    def __init__(self, outbound: zmq.Socket[bytes]) -> None:
        self.outbound = outbound
        self.stage = "loading"
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._report, name="cadenza-engine-starting", daemon=True
        )

    def __enter__(self) -> _StartupReports:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def set_stage(self, stage: str) -> None:
        log.info("%s", stage)
        self.stage = stage

    def _report(self) -> None:
        while True:
            report = messages.Starting(self.stage[:200], _cpu_s())
            with contextlib.suppress(zmq.ZMQError):  # the edge not reading: its deadline decides
                self.outbound.send(messages.encode(report), flags=zmq.NOBLOCK)
            if self._done.wait(STARTUP_REPORT_S):
                return


def _cpu_s() -> float:
    """CPU time this process has used, with its children that ended (a native kernel's
    compiler, at its first start on a machine)."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def _serve(
    engine: ServingEngine,
    inbound: zmq.Socket[bytes],
    outbound: zmq.Socket[bytes],
    stop: threading.Event | None,
    remeasure_idle_s: float = 0.0,
) -> None:
    from cadenza.engine.realtime.remeasure import (  # torch: only in this process
        RemeasureSchedule,
        wants_remeasure,
    )

    parent_pid = os.getppid()
    last_stats = busy_at = time.monotonic()
    schedule = RemeasureSchedule(remeasure_idle_s)
    while stop is None or not stop.is_set():
        timeout_ms = _wait_ms(engine)
        while inbound.poll(timeout_ms):
            timeout_ms = 0
            message = _decode(inbound.recv(), outbound)
            if isinstance(message, messages.Probe):
                _probe(engine, message, inbound, outbound)
                last_stats = time.monotonic()
            elif message is not None and not _handle(engine, message, outbound):
                return
        if engine.has_unfinished_requests():
            busy_at = time.monotonic()
            if engine.idle_s() <= 0:
                for output in engine.step():
                    sent = messages.Output.of(output, sent_s=time.monotonic())
                    outbound.send(messages.encode(sent))
        elif wants_remeasure(engine) and schedule.due(time.monotonic() - busy_at):
            arrived = _remeasure(engine, inbound, outbound, schedule)
            last_stats = busy_at = time.monotonic()
            if arrived is not None and not _handle(engine, arrived, outbound):
                return
        now = time.monotonic()
        if now - last_stats >= STATS_INTERVAL_S:
            report = messages.Stats(engine.stats(), engine.take_report())
            outbound.send(messages.encode(report))
            last_stats = now
            if stop is None and os.getppid() != parent_pid:
                log.warning("edge process is gone; engine exits")
                return


def _wait_ms(engine: ServingEngine) -> int:
    """How long to wait for messages before the next step: not at all while a stream needs a
    step, until the first stream does when all are far enough ahead, briefly when idle."""
    if not engine.has_unfinished_requests():
        return IDLE_POLL_MS
    idle_s = engine.idle_s()
    return 0 if idle_s <= 0 else min(math.ceil(1000 * idle_s), MAX_LEAD_POLL_MS, IDLE_POLL_MS)


def _decode(data: bytes, outbound: zmq.Socket[bytes]) -> messages.Message | None:
    """One message from the edge (``None``: garbled, dropped, its stream refused)."""
    try:
        return messages.decode(data)
    except messages.WireError as exc:
        log.error("dropping an engine message: %s", exc)
        if exc.request_id is not None:
            _reject(exc.request_id, str(exc), outbound)
        return None


def _probe(
    engine: ServingEngine,
    message: messages.Probe,
    inbound: zmq.Socket[bytes],
    outbound: zmq.Socket[bytes],
) -> None:
    """Run a probe if the engine is idle: what it reported until now goes out first as
    ``stats``, the probe's steps apart in ``probed``; anything arriving ends the probe."""
    if not engine.has_unfinished_requests():
        outbound.send(messages.encode(messages.Stats(engine.stats(), engine.take_report())))
    from cadenza.engine.realtime.probe import probe_engine  # torch: only in this process

    result = probe_engine(engine, message.batch, message.max_ms, lambda: inbound.poll(0) > 0)
    probed = messages.Probed(result.report, result.batch, result.outcome)
    outbound.send(messages.encode(probed))


def _remeasure(
    engine: Engine,
    inbound: zmq.Socket[bytes],
    outbound: zmq.Socket[bytes],
    schedule: RemeasureSchedule,
) -> messages.Message | None:
    """Measure ``engine`` again (:func:`~cadenza.engine.realtime.remeasure.remeasure`) until
    something arrives: meanwhile ``stats`` go out as from the idle engine (the heartbeat; the
    sweep's synthetic streams and steps are none of admission's business), a probe asked is
    answered ``busy``, and anything else stops the sweep and is returned, for the loop. A
    sweep that agrees with itself goes to the edge as ``recalibrated``."""
    from cadenza.engine.realtime.remeasure import remeasure  # torch: only in this process

    idle = messages.encode(messages.Stats(engine.stats(), StepReport()))
    arrived: list[messages.Message] = []
    last_stats = time.monotonic()

    def interrupted() -> bool:
        nonlocal last_stats
        if time.monotonic() - last_stats >= STATS_INTERVAL_S:
            outbound.send(idle)
            last_stats = time.monotonic()
        while not arrived and inbound.poll(0):
            message = _decode(inbound.recv(), outbound)
            if isinstance(message, messages.Probe):
                outbound.send(messages.encode(messages.Probed(StepReport(), 0, "busy")))
            elif message is not None:
                arrived.append(message)
        return bool(arrived)

    log.info("measuring step times again (the calibration contradicted itself; idle now)")
    result = remeasure(engine, interrupted)
    schedule.ended(result.outcome)
    if result.outcome == "agreed":
        outbound.send(messages.encode(messages.Recalibrated(result.calibration)))
    elif result.outcome == "interrupted":
        log.info("measuring again stopped: a request arrived")
    return arrived[0] if arrived else None


def _handle(engine: ServingEngine, message: messages.Message, outbound: zmq.Socket[bytes]) -> bool:
    """Apply one message from the edge; ``False`` once it says ``shutdown``."""
    if isinstance(message, messages.Shutdown):
        return False
    if isinstance(message, messages.AddRequest):
        try:
            engine.add_request(message.request)
        except (RequestRejected, ValueError) as exc:
            _reject(message.request.request_id, str(exc), outbound)
        except Exception as exc:  # a bug for this request only: refuse it, keep serving
            log.exception("could not add request %s", message.request.request_id)
            _reject(message.request.request_id, f"could not start the stream: {exc}", outbound)
    elif isinstance(message, messages.AbortRequest):
        engine.abort_request(message.request_id)
    else:
        log.warning("ignoring an engine-bound %s message", message.type)
    return True


def _reject(request_id: str, reason: str, outbound: zmq.Socket[bytes]) -> None:
    rejected = StreamOutput(
        request_id, np.zeros(0, np.float32), FinishReason.ERROR, reason, error_code="rejected"
    )
    outbound.send(messages.encode(messages.Output.of(rejected)))
