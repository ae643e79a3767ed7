"""The engine's side of the IPC: a busy loop that owns the model, fed over ZeroMQ.

Run as its own process (``python -m cadenza.engine.engine_process``, started by
:class:`~cadenza.engine.client.EngineClient`) or, for tests and offline use, in a thread of the
caller's process with ``inproc://`` sockets. The edge binds both sockets; the engine connects.

Loop: drain every waiting message (block briefly when idle), run one engine step, send its
outputs, and every ``STATS_INTERVAL_S`` a ``stats`` message that doubles as the heartbeat the
edge's readiness check watches. A request the engine refuses gets a final ``output`` with
``error_code = "rejected"``; a request that fails inside the model gets ``"internal"``.
Every message a step produces is sent before the next step starts, so cancellations reach the
engine between steps and pages are only released when no step is using them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import zmq

from cadenza.config import CadenzaConfig
from cadenza.engine import messages
from cadenza.engine.calibration import load_or_calibrate
from cadenza.engine.engine import Engine, RequestRejected
from cadenza.engine.naive_engine import NaiveEngine
from cadenza.engine.request import FinishReason, StreamOutput
from cadenza.telemetry import configure_logging

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
IDLE_POLL_MS = 100


def run_engine_loop(
    config: CadenzaConfig,
    context: zmq.Context[zmq.Socket[bytes]],
    inbound_address: str,
    outbound_address: str,
    stop: threading.Event | None = None,
) -> None:
    """Load the model, announce ``ready``, then serve until ``shutdown`` (or ``stop`` is set)."""
    inbound = context.socket(zmq.PULL)
    outbound = context.socket(zmq.PUSH)
    inbound.connect(inbound_address)
    outbound.connect(outbound_address)
    try:
        try:
            engine, info = _load(config)
        except Exception as exc:
            log.exception("engine failed to load")
            outbound.send(
                messages.pack({"type": "fatal", "message": f"engine failed to load: {exc}"})
            )
            return
        outbound.send(messages.pack(messages.info_message(info)))
        _serve(engine, inbound, outbound, stop)
    finally:
        inbound.close(linger=0)
        outbound.close(linger=1000)


def _load(config: CadenzaConfig) -> tuple[Engine | NaiveEngine, messages.EngineInfo]:
    """Build the configured engine, calibrate it, and describe it for the edge."""
    if config.engine.kind == "naive":
        naive = NaiveEngine.from_config(config)
        return naive, naive.engine_info()
    engine = Engine.from_config(config)
    calibration = load_or_calibrate(engine, config.model.seed)
    return engine, engine.engine_info(None if calibration is None else calibration.to_dict())


def _serve(
    engine: Engine | NaiveEngine,
    inbound: zmq.Socket[bytes],
    outbound: zmq.Socket[bytes],
    stop: threading.Event | None,
) -> None:
    parent_pid = os.getppid()
    steps = messages.StepLog()
    last_stats = time.monotonic()
    while stop is None or not stop.is_set():
        timeout_ms = 0 if engine.has_unfinished_requests() else IDLE_POLL_MS
        while inbound.poll(timeout_ms):
            timeout_ms = 0
            message = messages.unpack(inbound.recv())
            if message["type"] == "shutdown":
                return
            _handle(engine, message, outbound)
        if engine.has_unfinished_requests():
            outputs = engine.step()
            stats = engine.stats()
            steps.step_s.append(engine.last_step_s)
            steps.step_decodes.append(stats.last_batch_decodes)
            for output in outputs:
                code = "internal" if output.finish_reason is FinishReason.ERROR else None
                outbound.send(messages.pack(messages.output_message(output, code)))
        now = time.monotonic()
        if now - last_stats >= STATS_INTERVAL_S:
            slacks = list(engine.chunk_slacks_s)
            engine.chunk_slacks_s.clear()
            report = messages.stats_message(steps, slacks, engine.stats())
            outbound.send(messages.pack(report))
            steps, last_stats = messages.StepLog(), now
            if stop is None and os.getppid() != parent_pid:
                log.warning("edge process is gone; engine exits")
                return


def _handle(
    engine: Engine | NaiveEngine, message: dict[str, Any], outbound: zmq.Socket[bytes]
) -> None:
    kind = message["type"]
    if kind == "add":
        try:
            request = messages.request_from_message(message)
            engine.add_request(request)
        except (RequestRejected, TypeError, ValueError, KeyError) as exc:
            raw = message.get("request")
            request_id = raw.get("request_id", "") if isinstance(raw, dict) else ""
            rejected = StreamOutput(
                str(request_id), np.zeros(0, np.float32), FinishReason.ERROR, str(exc)
            )
            outbound.send(messages.pack(messages.output_message(rejected, "rejected")))
    elif kind == "abort":
        engine.abort_request(str(message["request_id"]))
    else:
        log.warning("ignoring unknown engine message type %r", kind)


def main() -> None:
    parser = argparse.ArgumentParser(description="cadenza engine process (started by the edge)")
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--inbound", required=True)
    parser.add_argument("--outbound", required=True)
    args = parser.parse_args()
    config = CadenzaConfig.model_validate(json.loads(args.config_json))
    configure_logging(config.server.log_level, process="engine")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        run_engine_loop(config, context, args.inbound, args.outbound)
    finally:
        context.term()


if __name__ == "__main__":
    main()
