"""The engine process's busy loop around a :class:`ServingEngine`, fed over ZeroMQ.

Run as its own process (``python -m cadenza.ipc.engine_side``, started by
:class:`~cadenza.ipc.edge_side.engine_client.EngineClient`) or, for tests and offline use, in a
thread of the caller's process with ``inproc://`` sockets. The edge binds both sockets; the engine
connects.

Loop: drain every waiting message (block briefly when idle, or until the first stream needs a
step when every stream is far enough ahead of its listener), run one engine step, send its
outputs, and every ``STATS_INTERVAL_S`` a ``stats`` message that doubles as the heartbeat the
edge's readiness check watches. A request the engine refuses (or fails to add) gets a final
``output`` with ``error_code = "rejected"``; a step that raises outside the engine's per-request
isolation ends the loop with ``fatal``. Every message a step produces is sent before the next step
starts, so cancellations reach the engine between steps and pages are only released when no
step is using them.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from cadenza.config import CadenzaConfig
from cadenza.contract import messages
from cadenza.contract.engine_stats import STATS_INTERVAL_S
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import FinishReason, StreamOutput
from cadenza.engine.serving_engine import ServingEngine

log = logging.getLogger(__name__)

IDLE_POLL_MS = 100
EDGE_GONE_AFTER_S = 30.0
MAX_LEAD_POLL_MS = 20  # streams far ahead: look again this soon (stats keep their pace)


def run_engine_loop(
    config: CadenzaConfig,
    context: zmq.Context[zmq.Socket[bytes]],
    inbound_address: str,
    outbound_address: str,
    stop: threading.Event | None = None,
    after_load: Callable[[], None] | None = None,
) -> None:
    """Load the model, announce ``ready``, then serve until ``shutdown`` (or ``stop`` is set).
    ``after_load`` runs once the engine has loaded, before ``ready`` (an engine in its own
    process settles its heap there: :func:`cadenza.gc_pauses.settle_after_loading`)."""
    from cadenza.engine.builder import build_serving_engine  # torch: only in this process

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
            engine = build_serving_engine(config)
        except Exception as exc:
            log.exception("engine failed to load")
            outbound.send(messages.encode(messages.Fatal(f"engine failed to load: {exc}")))
            return
        if after_load is not None:
            after_load()
        outbound.send(messages.encode(messages.Ready(engine.info)))
        try:
            _serve(engine, inbound, outbound, stop)
        except Exception as exc:  # a step that failed outside per-request isolation
            log.exception("engine failed")
            outbound.send(messages.encode(messages.Fatal(f"engine failed: {exc}")))
    finally:
        inbound.close(linger=0)
        outbound.close(linger=1000)


def _serve(
    engine: ServingEngine,
    inbound: zmq.Socket[bytes],
    outbound: zmq.Socket[bytes],
    stop: threading.Event | None,
) -> None:
    parent_pid = os.getppid()
    last_stats = time.monotonic()
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
        if engine.has_unfinished_requests() and engine.idle_s() <= 0:
            for output in engine.step():
                sent = messages.Output.of(output, sent_s=time.monotonic())
                outbound.send(messages.encode(sent))
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
