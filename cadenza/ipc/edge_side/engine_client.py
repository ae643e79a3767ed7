"""``EngineClient``: the edge's asynchronous handle on the engine, over ZeroMQ + msgpack.

It starts the engine (a child process, or a thread for ``mode = "inprocess"``), waits for its
``ready``, then routes each stream's outputs to the caller iterating :meth:`generate`. It runs
in the edge process and never imports torch (the in-process mode, for tests and tools, is the
one exception: there the engine is a thread of this process).

Backpressure: every stream has a bounded queue of undelivered outputs. A consumer that falls
``server.max_queued_chunks`` behind is cut off: its request is aborted in the engine and its
iterator raises :class:`EngineError` with code ``slow_consumer``. Leaving the iteration early
(a client that disconnects) aborts the request, which frees it at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace

import zmq
import zmq.asyncio

from cadenza.config import CadenzaConfig
from cadenza.contract import messages
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError, EngineErrorCode, EngineUnavailable
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.ipc.edge_side.start_deadline import StartDeadline

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 5.0  # not ready while the engine has been silent this long
_SEND_HWM = 10_000

StatsCallback = Callable[[messages.Stats], None]
"""Called with each ``stats`` message."""

FailureCallback = Callable[[str], None]
"""Called once with the reason when the engine is lost (it exited, or reported ``fatal``)."""

ProbeCallback = Callable[[messages.Probed], None]
"""Called with each probe the engine ran (:meth:`EngineClient.probe`)."""

CalibrationCallback = Callable[[EngineInfo], None]
"""Called with the engine's info once it has measured its steps again (``recalibrated``)."""

DelayCallback = Callable[[float], None]
"""Seconds from the engine sending an output to this client reading it (``on_output_delay``)."""

_Delivery = StreamOutput | EngineError


class EngineClient:
    def __init__(
        self,
        config: CadenzaConfig,
        on_stats: StatsCallback | None = None,
        on_failure: FailureCallback | None = None,
        replica: int = 0,
    ) -> None:
        self.config = config
        self.replica = replica
        self.on_stats = on_stats
        self.on_failure = on_failure
        self.on_output_delay: DelayCallback | None = None
        self.on_probe: ProbeCallback | None = None
        self.on_recalibrated: CalibrationCallback | None = None
        self.info: EngineInfo | None = None
        self.last_stats: messages.Stats | None = None
        self._context = zmq.asyncio.Context()
        self._sync_context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(
            self._context.underlying
        )
        self._to_engine: zmq.Socket[bytes] = self._sync_context.socket(zmq.PUSH)
        self._to_engine.setsockopt(zmq.SNDHWM, _SEND_HWM)
        self._from_engine = self._context.socket(zmq.PULL)
        self._streams: dict[str, asyncio.Queue[_Delivery]] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._thread_stop = threading.Event()
        self._socket_dir: tempfile.TemporaryDirectory[str] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0
        self._failure: str | None = None
        self._lost_error: EngineUnavailable | None = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine and wait until it has loaded. Raises :class:`EngineUnavailable`
        (or is cancelled) with nothing left running."""
        try:
            self._spawn()
            await self._wait_ready()
        except BaseException:
            await self.close()  # cancelled while it loaded: stop the process too
            raise
        self._last_heartbeat = time.monotonic()
        self._reader = asyncio.create_task(self._read_outputs(), name="cadenza-engine-reader")
        self._reader.add_done_callback(self._reader_ended)

    def _spawn(self) -> None:
        """Bind the sockets and start the engine (a process, or a thread)."""
        inbound, outbound = self._bind()
        if self.config.supervision.mode == "process":
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cadenza.ipc.engine_side",
                    "--config-file",
                    self._write_config(),
                    "--inbound",
                    inbound,
                    "--outbound",
                    outbound,
                    "--replica",
                    str(self.replica),
                ],
            )
        else:
            self._thread = threading.Thread(
                target=self._run_in_thread,
                args=(inbound, outbound),
                name="cadenza-engine",
                daemon=True,
            )
            self._thread.start()

    async def _wait_ready(self) -> None:
        """Until ``ready``, for as long as the engine makes progress (:class:`StartDeadline`:
        ``supervision.startup_timeout_s`` without any gives up on it)."""
        deadline = StartDeadline(self.config.supervision.startup_timeout_s, time.monotonic())
        while self.info is None:
            if deadline.expired(time.monotonic()):
                raise EngineUnavailable(deadline.reason())
            if await self._from_engine.poll(100):
                message = self._decode(await self._from_engine.recv())
                if isinstance(message, messages.Fatal):
                    raise EngineUnavailable(message.message)
                if isinstance(message, messages.Starting):
                    stage = deadline.stage
                    deadline.observe(message, time.monotonic())
                    if message.stage != stage:
                        log.info("engine replica %d: %s", self.replica, message.stage)
                if isinstance(message, messages.Ready):
                    self.info = message.info
            elif not self._engine_alive():
                raise EngineUnavailable("engine exited during start-up")

    async def close(self) -> None:
        """Stop the engine and release every socket; pending streams fail ``unavailable``."""
        if self._closed:
            return
        self._closed = True
        self._fail_all("engine is shutting down")
        with contextlib.suppress(zmq.ZMQError):
            self._to_engine.send(messages.encode(messages.Shutdown()), flags=zmq.NOBLOCK)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._process is not None:
            # An engine that never became ready is not reading its messages: stop it at once.
            patience = 10.0 if self.info is not None else 0.0
            await asyncio.to_thread(self._stop_process, self._process, patience)
        if self._thread is not None:
            self._thread_stop.set()
            await asyncio.to_thread(self._thread.join, 30)
        self._to_engine.close(linger=0)
        self._from_engine.close(linger=0)
        self._context.term()
        if self._socket_dir is not None:
            self._socket_dir.cleanup()

    def is_ready(self) -> bool:
        """Loaded, alive, and heard from within the heartbeat timeout."""
        return (
            self.info is not None
            and not self._closed
            and self._failure is None
            and self._engine_alive()
            and time.monotonic() - self._last_heartbeat < HEARTBEAT_TIMEOUT_S
        )

    def require_ready(self) -> EngineInfo:
        """The engine's info; raises :class:`EngineUnavailable` unless it can take work now.
        The one readiness check every route and transport uses."""
        if not self.is_ready() or self.info is None:
            raise EngineUnavailable(
                f"engine is not ready: {self._failure}" if self._failure else "engine is not ready"
            )
        return self.info

    @property
    def failure(self) -> str | None:
        """Why the engine was lost (``None`` while it has not been)."""
        return self._failure

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def engine_pid(self) -> int | None:
        """The engine's process id, or ``None`` when it runs in a thread."""
        return self._process.pid if self._process is not None else None

    # -- streams ----------------------------------------------------------------------------

    async def generate(
        self, request: SynthesisRequest, continuing: bool = False
    ) -> AsyncGenerator[StreamOutput, None]:
        """Submit ``request`` and yield its outputs until the finished one. ``continuing``: the
        next part of a stream this engine already serves (a text stream's next segment): the
        engine need not have been heard from lately (a long step, Bark's on a CPU, is work,
        not a hang), only be loaded, alive and not lost.

        Raises :class:`EngineError` when the request is refused, fails, or loses its engine.
        """
        if not continuing:
            self.require_ready()
        elif self.info is None or self._closed or self._failure is not None:
            self.require_ready()  # raises, saying why
        elif not self._engine_alive():
            raise EngineUnavailable("engine is not ready")
        if request.request_id in self._streams:
            raise EngineError(f"duplicate request id {request.request_id!r}", "rejected")
        queue: asyncio.Queue[_Delivery] = asyncio.Queue(self.config.server.max_queued_chunks)
        self._streams[request.request_id] = queue
        finished = False
        try:
            self._send(messages.AddRequest(request))
            while True:
                if queue.empty() and self._lost_error is not None:
                    raise self._lost_error  # its queue was full when the engine was lost
                item = await queue.get()
                if isinstance(item, EngineError):
                    finished = item.code != "slow_consumer"
                    raise item
                finished = item.finished
                if item.finish_reason is FinishReason.ERROR:
                    rejected = item.error_code == "rejected"
                    raise EngineError(
                        item.error or "request failed", "rejected" if rejected else "internal"
                    )
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                self.abort(request.request_id)

    def end_stream(self, request_id: str, reason: str, code: EngineErrorCode) -> None:
        """End one stream from the edge's side (a drain that ran out of time): its caller
        reads :class:`EngineError` ``code`` after what it has already been sent, and the
        engine aborts it."""
        self._fail_stream(request_id, reason, code)

    def abort(self, request_id: str) -> None:
        """Cancel a stream in the engine (no-op if it already ended)."""
        self._streams.pop(request_id, None)
        if not self._closed:
            with contextlib.suppress(zmq.ZMQError, EngineError):
                self._send(messages.AbortRequest(request_id))

    def probe(self, batch: int, max_ms: float) -> None:
        """Ask the engine to measure ``batch`` synthetic streams while it is idle; what it
        ran comes to :attr:`on_probe` (nothing is sent to an engine that is gone)."""
        if not self._closed:
            with contextlib.suppress(zmq.ZMQError, EngineError):
                self._send(messages.Probe(batch, max_ms))

    # -- internals --------------------------------------------------------------------------

    def _bind(self) -> tuple[str, str]:
        if self.config.supervision.mode == "process":
            self._socket_dir = tempfile.TemporaryDirectory(prefix="cadenza-")
            inbound = f"ipc://{self._socket_dir.name}/to-engine"
            outbound = f"ipc://{self._socket_dir.name}/from-engine"
        else:
            tag = uuid.uuid4().hex
            inbound, outbound = f"inproc://{tag}-to-engine", f"inproc://{tag}-from-engine"
        self._to_engine.bind(inbound)
        self._from_engine.bind(outbound)
        return inbound, outbound

    def _write_config(self) -> str:
        """The engine's configuration (less the edge's secrets), as JSON in a file of the
        private socket directory that only this user may read: a process's command line is
        readable by every user of the machine, so no configuration value goes there."""
        assert self._socket_dir is not None
        path = os.path.join(self._socket_dir.name, "config.json")
        text = json.dumps(self.config.without_secrets().model_dump(mode="json"))
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        return path

    def _run_in_thread(self, inbound: str, outbound: str) -> None:
        # In-process mode only: the engine (and torch) load into this process on purpose.
        from cadenza.ipc.engine_side.engine_loop import run_engine_loop

        run_engine_loop(self.config, self._sync_context, inbound, outbound, self._thread_stop)

    def _send(self, message: messages.EdgeMessage) -> None:
        try:
            self._to_engine.send(messages.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again as exc:
            raise EngineUnavailable("engine input queue is full") from exc

    def _engine_alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        if self._thread is not None:
            return self._thread.is_alive()
        return False

    @staticmethod
    def _decode(data: bytes) -> messages.Message | None:
        try:
            return messages.decode(data)
        except messages.WireError as exc:
            log.error("dropping a message from the engine: %s", exc)
            return None

    async def _read_outputs(self) -> None:
        while True:
            if not await self._from_engine.poll(250):
                if not self._engine_alive():
                    self._lose_engine("engine process exited")
                    return
                silent_limit = self.config.supervision.heartbeat_timeout_s
                if time.monotonic() - self._last_heartbeat > silent_limit:
                    self._lose_engine(f"engine hung: it sent nothing for {silent_limit:g} s")
                    if self._process is not None:
                        self._process.kill()
                    return
                continue
            data = await self._from_engine.recv()
            try:
                message = messages.decode(data)
            except messages.WireError as exc:
                log.error("dropping a message from the engine: %s", exc)
                if exc.request_id is not None:
                    self._fail_stream(exc.request_id, f"invalid engine output: {exc}")
                continue
            if isinstance(message, messages.Output):
                if message.sent_s is not None and self.on_output_delay is not None:
                    self.on_output_delay(time.monotonic() - message.sent_s)
                self._deliver(message)
            elif isinstance(message, messages.Stats):
                self._last_heartbeat = time.monotonic()
                self.last_stats = message
                if self.on_stats is not None:
                    try:
                        self.on_stats(message)
                    except Exception:
                        log.exception("engine stats callback failed")
            elif isinstance(message, messages.Probed):
                if self.on_probe is not None:
                    try:
                        self.on_probe(message)
                    except Exception:
                        log.exception("engine probe callback failed")
            elif isinstance(message, messages.Recalibrated) and self.info is not None:
                self.info = replace(self.info, calibration=message.calibration)
                if self.on_recalibrated is not None:
                    try:
                        self.on_recalibrated(self.info)
                    except Exception:
                        log.exception("engine calibration callback failed")
            elif isinstance(message, messages.Fatal):
                self._lose_engine(message.message)

    def _reader_ended(self, reader: asyncio.Task[None]) -> None:
        if not reader.cancelled() and (exc := reader.exception()) is not None:
            log.error("engine reader failed", exc_info=exc)
            self._lose_engine(f"engine reader failed: {exc}")

    def _deliver(self, message: messages.Output) -> None:
        queue = self._streams.get(message.request_id)
        if queue is None:
            return  # the stream was abandoned; its abort is on the way
        try:
            output = message.stream_output()
        except messages.WireError as exc:
            self._fail_stream(message.request_id, f"invalid engine output: {exc}")
            return
        try:
            queue.put_nowait(output)
        except asyncio.QueueFull:
            self._fail_stream(
                message.request_id,
                "client is not reading fast enough",
                code="slow_consumer",
            )

    def _fail_stream(
        self, request_id: str, reason: str, code: EngineErrorCode = "internal"
    ) -> None:
        """End one stream with :class:`EngineError` ``code``, the last thing its caller reads
        (one undelivered output may make room for it), and tell the engine to abort it."""
        queue = self._streams.get(request_id)
        self.abort(request_id)
        if queue is None:
            return
        with contextlib.suppress(asyncio.QueueEmpty):
            queue.get_nowait()  # make room for the error
        queue.put_nowait(EngineError(reason, code))

    def _lose_engine(self, reason: str) -> None:
        if self._failure is not None:
            return
        self._failure = reason
        log.error("engine lost: %s", reason)
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        """Every stream ends with :class:`EngineUnavailable` after the outputs it has not read
        yet (none is dropped: their rows are what a resumed stream goes on from)."""
        if self.on_failure is not None:
            self.on_failure(reason)
        self._lost_error = EngineUnavailable(reason)
        for queue in self._streams.values():
            if not queue.full():
                queue.put_nowait(self._lost_error)
            # a full queue gets it once drained (see generate)

    @staticmethod
    def _stop_process(process: subprocess.Popen[bytes], patience_s: float) -> None:
        try:
            process.wait(timeout=patience_s)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
