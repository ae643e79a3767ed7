"""Stream checkpoints in Redis: what another node needs to go on with a stream whose node was
lost (``limits.redis_url``; WebSocket and WebRTC streams).

When a resumable stream starts, its node gives it a resume token (in ``started``) and writes
the stream's head to Redis: the model, the client, the output format and the request as it was
admitted (text, voice, sampling, seed, context). As the engine's outputs arrive the node
appends what each carried: its rows (the tokens generated) and how many codec frames and
samples of audio the stream has had up to it. The first output is written at once; later ones
wait up to :data:`WRITE_INTERVAL_S` to share one pipelined round trip (one ``RPUSH``), made by a
task of the stream's own, so the stream never waits for Redis. The time to live
(``server.checkpoint_ttl_s``) is renewed with a write at least every third of it: a stream that
ends, or whose node goes silent, is gone from Redis at most that long after its last write;
one that ends normally is deleted at once. What the last half second added may be missing
when a node dies: a resume then goes on from the last boundary written, and the engine
generates the rest again (identically for greedy and seeded streams, which is why the edge
gives every checkpointed stream a seed).

A client that lost its connection before ``done`` reconnects (through the front door, so to
any node) and sends ``resume`` with the token and how much audio it has heard. The node that
gets it claims the checkpoint in one atomic step (:meth:`CheckpointStore.claim`): the head and
rows are read and deleted, and a tombstone says the token was used, so of two clients racing
on one token exactly one wins. The claim is refused, with a code the client is told, when the
token is unknown or expired (``resume_not_found``), already used (``resume_taken``), or, with
API keys on, another key's (``resume_forbidden``; without keys a client's address may change
on reconnecting, so the token alone, 192 random bits, is the proof).

:func:`resume_point` turns what the client heard into where the engine goes on: the last
output boundary at or before it (the engine rebuilds the codec there, as after an engine loss)
and how much of the continuation's audio the client already has, to be dropped before sending.
At the codec's own sample rate (``pcm`` at the model's rate) and for ``encodec`` codes the
continuation is exact: no sample repeated, none missing. Resampled ``pcm`` and ``opus`` start a
fresh resampler or encoder at the resume point, so the first few milliseconds after the gap
differ from an uninterrupted stream's.

Keys, braced so that a stream's keys share a Redis Cluster slot: ``cadenza:stream:{TOKEN}:head``
(a hash: ``client``, ``data``), ``:rows`` (a list, one item per output) and ``:used`` (the
tombstone).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import redis.asyncio as aioredis
from pydantic import TypeAdapter, ValidationError
from redis.exceptions import RedisError

from cadenza.contract.request import ResumePoint, StreamOutput, SynthesisRequest
from cadenza.edge.admission.priority_queues import PRIORITIES, Priority
from cadenza.edge.server.metrics import Metrics

log = logging.getLogger(__name__)

TIMEOUT_S = 1.0  # one round trip at most (a write, a claim)
WRITE_INTERVAL_S = 0.5  # a stream's outputs are written together at most this often

_REQUEST: TypeAdapter[SynthesisRequest] = TypeAdapter(SynthesisRequest)

# KEYS: head, rows, used. ARGV: the claiming client, the tombstone's time to live (ms), the
# claiming node. Returns {status} or {'ok', head data, rows...}.
_CLAIM = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {'resume_taken'} end
local owner = redis.call('HGET', KEYS[1], 'client')
if not owner then return {'resume_not_found'} end
if string.sub(owner, 1, 4) == 'key:' and owner ~= ARGV[1] then return {'resume_forbidden'} end
local data = redis.call('HGET', KEYS[1], 'data')
local rows = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[2]))
redis.call('DEL', KEYS[1], KEYS[2])
local answer = {'ok', data}
for i = 1, #rows do answer[#answer + 1] = rows[i] end
return answer
"""


def _keys(token: str) -> list[str]:
    prefix = f"cadenza:stream:{{{token}}}"
    return [f"{prefix}:head", f"{prefix}:rows", f"{prefix}:used"]


class ResumeRefused(Exception):
    """A ``resume`` that cannot be served; ``code`` is the documented error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StreamHead:
    """What a stream was, as admitted: enough to admit it again elsewhere."""

    model: str
    client: str
    format: str
    sample_rate: int  # of the audio the client receives
    request: SynthesisRequest  # without a resume point
    priority: Priority = "realtime"


@dataclass(frozen=True)
class Boundary:
    """After one output: the codec frames and the samples (at the codec's rate) heard so far."""

    frames: int
    samples: int


@dataclass(frozen=True)
class Checkpoint:
    """A claimed stream: its head, the rows each output carried (``[rows, width]`` int32,
    possibly none) with the boundary after it, and when its node last wrote (wall clock), for
    the gap the listener heard."""

    head: StreamHead
    parts: tuple[np.ndarray, ...]
    boundaries: tuple[Boundary, ...]
    last_write: float

    @property
    def rows(self) -> np.ndarray:
        """Every row generated, in order."""
        parts = [part for part in self.parts if part.size]
        return np.concatenate(parts) if parts else np.zeros((0, 1), np.int32)


def seeded(request: SynthesisRequest) -> SynthesisRequest:
    """``request`` with a seed of its own when it has none: what a resume regenerates (the
    rows a lost node had not written yet) is then what the listener would have heard."""
    if request.sampling.seed is not None:
        return request
    sampling = dataclasses.replace(request.sampling, seed=secrets.randbelow(2**63))
    return dataclasses.replace(request, sampling=sampling)


def resume_point(
    checkpoint: Checkpoint, heard: int, unit: str
) -> tuple[ResumePoint, Boundary, int]:
    """Where the engine goes on for a client that heard ``heard`` samples (at the codec's rate,
    ``unit="samples"``) or codec frames (``unit="frames"``): the resume point, the output
    boundary it stands at, and how many of the continuation's samples or frames the client
    already has (to drop)."""
    reached = Boundary(0, 0)
    for boundary in checkpoint.boundaries:
        if (boundary.samples if unit == "samples" else boundary.frames) > heard:
            break
        reached = boundary
    rows = tuple(map(tuple, checkpoint.rows.tolist()))
    drop = heard - (reached.samples if unit == "samples" else reached.frames)
    return ResumePoint(rows, reached.frames), reached, drop


class CheckpointStore:
    """The checkpoints of this node's streams, in the Redis at ``url``."""

    def __init__(self, url: str, ttl_s: float, node: str, metrics: Metrics) -> None:
        self.ttl_ms = max(int(ttl_s * 1000), 1)
        self.node = node
        self.metrics = metrics
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._claim = self.redis.register_script(_CLAIM)
        self._writers: set[StreamCheckpoint] = set()
        self._failing = False

    def begin(
        self,
        token: str,
        head: StreamHead,
        rows: np.ndarray | None = None,
        heard: Boundary | None = None,
    ) -> StreamCheckpoint:
        """Start writing the checkpoint of a stream (``rows`` and ``heard``: where a resumed
        stream already stands)."""
        writer = StreamCheckpoint(self, token, head, heard or Boundary(0, 0))
        if rows is not None and len(rows):
            writer.record_rows(rows, writer.heard)
        self._writers.add(writer)
        return writer

    async def claim(self, token: str, client: str) -> Checkpoint:
        """Take the checkpoint of ``token`` for ``client`` (see the module docstring). Raises
        :class:`ResumeRefused`."""
        try:
            answer = await asyncio.wait_for(
                self._claim(keys=_keys(token), args=[client, self.ttl_ms, self.node]),
                TIMEOUT_S * 2,
            )
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            raise ResumeRefused(
                "resume_unavailable", "the stream checkpoints cannot be read (Redis unreachable)"
            ) from exc
        status = answer[0].decode() if isinstance(answer[0], bytes) else str(answer[0])
        if status != "ok":
            raise ResumeRefused(status, _REFUSALS[status])
        try:
            return _decode(answer[1], answer[2:])
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            message = f"the stream's checkpoint is damaged: {exc}"
            raise ResumeRefused("resume_not_found", message) from exc

    def restore(self, token: str, checkpoint: Checkpoint) -> None:
        """Put back a claimed checkpoint whose stream could not be resumed here (no room, no
        engine), so that its client may try again; the tombstone goes."""
        writer = StreamCheckpoint(self, token, checkpoint.head, Boundary(0, 0), unclaim=True)
        for boundary, rows in zip(checkpoint.boundaries, checkpoint.parts, strict=True):
            writer.record_rows(rows, boundary, at=checkpoint.last_write)
        self._writers.add(writer)
        writer.end(False)

    async def close(self) -> None:
        """Let the writes in flight finish (briefly), then close the connections."""
        tasks = [w.task for w in self._writers if w.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=TIMEOUT_S)
        await self.redis.aclose()

    def _failed(self, exc: BaseException) -> None:
        self.metrics.checkpoint_failures.inc()
        if not self._failing:
            log.warning("stream checkpoints: Redis failed (%s); streams go on unprotected", exc)
        self._failing = True

    def _reached(self) -> None:
        if self._failing:
            log.info("stream checkpoints: Redis answers again")
        self._failing = False


_REFUSALS = {
    "resume_not_found": "no stream has that resume token (it is wrong, or expired)",
    "resume_taken": "that stream was already resumed",
    "resume_forbidden": "that stream belongs to another API key",
}


class StreamCheckpoint:
    """The checkpoint one stream writes as it plays (see the module docstring). ``record``
    and ``end`` never wait for Redis."""

    def __init__(
        self,
        store: CheckpointStore,
        token: str,
        head: StreamHead,
        heard: Boundary,
        unclaim: bool = False,
    ) -> None:
        self.store = store
        self.token = token
        self.heard = heard  # the stream's frames and samples so far
        self._head = head
        self._unclaim = unclaim  # a restored checkpoint: its tombstone goes with the first write
        self._pending: list[bytes] = []
        self._head_written = False
        self._ended: bool | None = None  # once ended: whether the stream finished
        self._broken = False
        self._wake = asyncio.Event()  # outputs to write, or the end
        self._end = asyncio.Event()
        self._renewed_at: float | None = None  # when the keys' time to live was last renewed
        self.task = asyncio.get_running_loop().create_task(self._write_loop())

    def record(self, output: StreamOutput) -> None:
        """What ``output`` carried: its rows, and its frames and samples (at the codec's
        rate) added to the stream's."""
        frames = 0 if output.codes is None else len(output.codes)
        self.heard = Boundary(self.heard.frames + frames, self.heard.samples + len(output.audio))
        if output.rows is not None and len(output.rows):
            self.record_rows(output.rows, self.heard)
        elif frames or len(output.audio):
            self.record_rows(np.zeros((0, 0), np.int32), self.heard)

    def record_rows(self, rows: np.ndarray, heard: Boundary, at: float | None = None) -> None:
        """``rows`` generated, ``heard`` being the stream's total after them; ``at``: when
        (wall clock; now by default)."""
        rows = np.ascontiguousarray(rows, dtype=np.int32)
        item = {
            "rows": rows.tobytes(),
            "width": int(rows.shape[1]) if rows.ndim == 2 and rows.size else 0,
            "frames": heard.frames,
            "samples": heard.samples,
            "at": time.time() if at is None else at,
        }
        self._pending.append(msgpack.packb(item, use_bin_type=True))
        self._wake.set()

    def end(self, finished: bool) -> None:
        """The stream is over here: ``finished`` (its last output was sent) deletes the
        checkpoint; otherwise it stays for a resume until its time to live runs out."""
        self._ended = finished
        self._end.set()
        self._wake.set()

    async def _write_loop(self) -> None:
        store = self.store
        head, rows, _ = _keys(self.token)
        try:
            while True:
                await self._wake.wait()
                if self._ended is None and self._head_written:
                    # Outputs wait up to WRITE_INTERVAL_S to share a round trip (a resume from
                    # a boundary before the last one the client heard regenerates the rest).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._end.wait(), WRITE_INTERVAL_S)
                self._wake.clear()
                batch, self._pending = self._pending, []
                ended = self._ended
                if batch and not self._broken:
                    await self._write(head, rows, batch)
                if ended is not None:
                    if ended and not self._broken and self._head_written:
                        with contextlib.suppress(RedisError, OSError, TimeoutError):
                            await asyncio.wait_for(store.redis.delete(head, rows), TIMEOUT_S)
                    return
        finally:
            store._writers.discard(self)

    async def _write(self, head: str, rows: str, batch: list[bytes]) -> None:
        store = self.store
        pipe = store.redis.pipeline(transaction=False)
        if not self._head_written:
            pipe.hset(head, mapping={"client": self._head.client, "data": _encode_head(self._head)})
            if self._unclaim:
                pipe.delete(_keys(self.token)[2])
        pipe.rpush(rows, *batch)
        now = time.monotonic()
        renew = self._renewed_at is None or now - self._renewed_at > store.ttl_ms / 3000
        if renew:  # a third of the time to live at most between renewals
            pipe.pexpire(head, store.ttl_ms)
            pipe.pexpire(rows, store.ttl_ms)
        try:
            await asyncio.wait_for(pipe.execute(), TIMEOUT_S)
        except (RedisError, OSError, TimeoutError) as exc:
            store._failed(exc)
            self._broken = True  # a gap in its rows: no resume could be exact
            return
        store._reached()
        store.metrics.checkpoint_writes.inc()
        self._head_written = True
        if renew:
            self._renewed_at = now


def _encode_head(head: StreamHead) -> bytes:
    fields: dict[str, Any] = dataclasses.asdict(head) | {
        "request": _REQUEST.dump_python(head.request, mode="python")
    }
    return msgpack.packb(fields, use_bin_type=True)


def _decode(data: bytes, items: list[bytes]) -> Checkpoint:
    fields = msgpack.unpackb(data, raw=False)
    request = _REQUEST.validate_python(fields["request"])
    head = StreamHead(
        str(fields["model"]), str(fields["client"]), str(fields["format"]),
        int(fields["sample_rate"]), request, _priority(fields.get("priority")),
    )  # fmt: skip
    parts: list[np.ndarray] = []
    boundaries: list[Boundary] = []
    last_write = 0.0
    for raw in items:
        item = msgpack.unpackb(raw, raw=False)
        width = int(item["width"])
        rows = np.frombuffer(item["rows"], np.int32)
        parts.append(rows.reshape(-1, width) if width else np.zeros((0, 1), np.int32))
        boundaries.append(Boundary(int(item["frames"]), int(item["samples"])))
        last_write = float(item["at"])
    return Checkpoint(head, tuple(parts), tuple(boundaries), last_write)


def _priority(value: object) -> Priority:
    return value if value in PRIORITIES else "realtime"
