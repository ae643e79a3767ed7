"""Stream checkpoints in Redis: what another node needs to go on with a stream whose node was
lost (``limits.redis_url`` and ``auth.token_secret``; WebSocket and WebRTC streams).

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

Sealed: the head's data and every rows item are sealed with AES-256-GCM under a key derived
from ``auth.token_secret`` (:mod:`cadenza.edge.streams.checkpoint_seal`), bound to the stream's
token and to the item's place (the head with its owner, ``rows/<index>``). Redis holds no text,
voice, audio or tokens in the clear, and an item altered, moved between streams or fields, or
written by a node with another secret does not open: the resume is refused with
``resume_invalid`` (and logged), and nothing of it reaches an engine. Without
``auth.token_secret`` the nodes of a fleet would share no key, so the server keeps no
checkpoints at all. The hash's ``client`` field stays readable, for the claim's owner check:
``key:<id>`` (an API key's id, the first 12 hex digits of its SHA-256, never the key) or
``open`` on a server without keys (the client's address is not written in the clear).

Live streams: while a stream's node serves it (its client connected, from the first write to
the stream's end there) the node keeps a ``:live`` marker: set with every write and at least
every :data:`LIVE_RENEW_S` by the stream's write task, living :data:`LIVE_TTL_S`. It goes when
the stream ends there (done, failed, or its client gone: :meth:`StreamCheckpoint.end`), and
expires by itself when the node dies. A resume of a live stream is refused (``resume_live``):
a leaked token cannot take over a stream that still plays, and the stream goes on. A claim that
finds the marker waits up to :data:`LIVE_WAIT_S` for it to go before refusing, so the client of
a lost connection (whose node deletes the marker as it sees the disconnect) and the client of a
dead node (whose marker expires) resume without a retry of their own.

A client that lost its connection before ``done`` reconnects (through the front door, so to
any node) and sends ``resume`` with the token and how much audio it has heard. The node that
gets it claims the checkpoint in one atomic step (:meth:`CheckpointStore.claim`): the head and
rows are read and deleted, and a tombstone says the token was used, so of two clients racing
on one token exactly one wins. The claim is refused, with a code the client is told, when the
token is unknown or expired (``resume_not_found``), already used (``resume_taken``), with API
keys on another key's (``resume_forbidden``; a client token counts as the key that minted it;
without keys a client's address may change on reconnecting, so the token alone, 192 random
bits, is the proof), still live (``resume_live``), or when the checkpoint does not open
(``resume_invalid``).

:func:`resume_point` turns what the client heard into where the engine goes on: the last
output boundary at or before it (the engine rebuilds the codec there, as after an engine loss)
and how much of the continuation's audio the client already has, to be dropped before sending.
At the codec's own sample rate (``pcm`` at the model's rate) and for ``encodec`` codes the
continuation is exact: no sample repeated, none missing. Resampled ``pcm`` and ``opus`` start a
fresh resampler or encoder at the resume point, so the first few milliseconds after the gap
differ from an uninterrupted stream's.

Keys, braced so that a stream's keys share a Redis Cluster slot: ``cadenza:stream:{TOKEN}:head``
(a hash: ``client``, sealed ``data``), ``:rows`` (a list, one sealed item per output), ``:used``
(the tombstone) and ``:live`` (the node serving it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import redis.asyncio as aioredis
from pydantic import TypeAdapter, ValidationError
from redis.exceptions import RedisError

from cadenza.contract.request import ResumePoint, StreamOutput, SynthesisRequest
from cadenza.edge.admission.priority_queues import PRIORITIES, Priority
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.streams.checkpoint_seal import CheckpointSeal, SealBroken, StreamSeal

if TYPE_CHECKING:
    from cadenza.config import CadenzaConfig

log = logging.getLogger(__name__)

TIMEOUT_S = 1.0  # one round trip at most (a write, a claim)
WRITE_INTERVAL_S = 0.5  # a stream's outputs are written together at most this often
LIVE_TTL_S = 3.0  # a live marker not renewed for this long is gone (its node died)
LIVE_RENEW_S = 1.0  # a live stream's marker is renewed at least this often
LIVE_WAIT_S = LIVE_TTL_S + 0.5  # a claim waits this long for a live marker to go
LIVE_POLL_S = 0.2  # and asks again this often meanwhile

_REQUEST: TypeAdapter[SynthesisRequest] = TypeAdapter(SynthesisRequest)

# KEYS: head, rows, used, live. ARGV: the claiming owner, the tombstone's time to live (ms),
# the claiming node. Returns {status} or {'ok', owner, sealed head data, sealed rows...}. The
# owner is checked before the live marker: another key's client is refused at once.
_CLAIM = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {'resume_taken'} end
local owner = redis.call('HGET', KEYS[1], 'client')
if not owner then return {'resume_not_found'} end
if string.sub(owner, 1, 4) == 'key:' and owner ~= ARGV[1] then return {'resume_forbidden'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'resume_live'} end
local data = redis.call('HGET', KEYS[1], 'data')
local rows = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[2]))
redis.call('DEL', KEYS[1], KEYS[2])
local answer = {'ok', owner, data}
for i = 1, #rows do answer[#answer + 1] = rows[i] end
return answer
"""


def _keys(token: str) -> list[str]:
    """The stream's head, rows, used (tombstone) and live keys."""
    prefix = f"cadenza:stream:{{{token}}}"
    return [f"{prefix}:head", f"{prefix}:rows", f"{prefix}:used", f"{prefix}:live"]


def owner_of(client: str) -> str:
    """The owner a checkpoint's ``client`` field holds for ``client``: ``key:<id>`` as is (a
    key and the client tokens it minted), ``open`` for anyone on a server without keys."""
    return client if client.startswith("key:") else "open"


def _head_field(owner: str) -> str:
    return f"head/{owner}"  # the head's data opens only with the owner it was written for


def _rows_field(index: int) -> str:
    return f"rows/{index}"


class ResumeRefused(Exception):
    """A ``resume`` that cannot be served; ``code`` is the documented error code, ``status``
    its HTTP status (409 for a stream still live, 503 when Redis is away, else 404)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = {"resume_live": 409, "resume_unavailable": 503}.get(code, 404)


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


def checkpoint_store(config: CadenzaConfig, metrics: Metrics) -> CheckpointStore | None:
    """The store ``config`` asks for: with ``limits.redis_url``, ``server.checkpoint_ttl_s``
    above 0 and ``auth.token_secret`` (the seal every node shares); ``None`` without one of
    them, with a warning when only the secret is missing."""
    if not config.limits.redis_url or config.server.checkpoint_ttl_s <= 0:
        return None
    secret = config.auth.token_secret
    if secret is None:
        log.warning(
            "stream checkpoints off: resuming a stream after its node is lost needs "
            "auth.token_secret (the same on every node) to seal them in Redis"
        )
        return None
    return CheckpointStore(
        config.limits.redis_url,
        config.server.checkpoint_ttl_s,
        config.server.node_name,
        metrics,
        CheckpointSeal.from_secret(secret.get_secret_value()),
    )


class CheckpointStore:
    """The checkpoints of this node's streams, in the Redis at ``url``, sealed with ``seal``
    (the same on every node of the fleet)."""

    def __init__(
        self, url: str, ttl_s: float, node: str, metrics: Metrics, seal: CheckpointSeal
    ) -> None:
        self.ttl_ms = max(int(ttl_s * 1000), 1)
        self.node = node
        self.metrics = metrics
        self.seal = seal
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
        """Take the checkpoint of ``token`` for ``client`` (see the module docstring); a live
        stream's is waited for up to :data:`LIVE_WAIT_S`. Raises :class:`ResumeRefused`."""
        owner = owner_of(client)
        patience = time.monotonic() + LIVE_WAIT_S
        while True:
            answer = await self._claim_once(token, owner)
            status = _text(answer[0])
            if status != "resume_live" or time.monotonic() + LIVE_POLL_S > patience:
                break
            await asyncio.sleep(LIVE_POLL_S)
        if status != "ok":
            raise ResumeRefused(status, _REFUSALS[status])
        try:
            return _decode(self.seal.stream(token), _text(answer[1]), answer[2], answer[3:])
        except (SealBroken, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning(
                "stream checkpoints: refused resuming stream %s...: its checkpoint does not "
                "open or decode (%s); altered in Redis, or written by a node with another "
                "auth.token_secret",
                token[:6],
                exc,
            )
            raise ResumeRefused(
                "resume_invalid",
                "the stream's checkpoint cannot be used (altered, or written by a node with "
                "another auth.token_secret)",
            ) from exc

    async def _claim_once(self, token: str, owner: str) -> list[Any]:
        try:
            return list(
                await asyncio.wait_for(
                    self._claim(keys=_keys(token), args=[owner, self.ttl_ms, self.node]),
                    TIMEOUT_S * 2,
                )
            )
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            raise ResumeRefused(
                "resume_unavailable", "the stream checkpoints cannot be read (Redis unreachable)"
            ) from exc

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
    "resume_live": "that stream still plays on its node (a resume goes on with a stream whose "
    "connection or node was lost)",
}


class StreamCheckpoint:
    """The checkpoint one stream writes as it plays, and its live marker while it plays here
    (see the module docstring). ``record`` and ``end`` never wait for Redis."""

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
        self._owner = owner_of(head.client)
        self._seal = store.seal.stream(token)
        self._unclaim = unclaim  # a restored checkpoint: its tombstone goes with the first write
        self._pending: list[bytes] = []  # sealed rows items not written yet
        self._items = 0  # rows items recorded: the next one's index
        self._head_written = False
        self._live = False  # whether this node's live marker is set
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
        packed = msgpack.packb(item, use_bin_type=True)
        self._pending.append(self._seal.seal(packed, _rows_field(self._items)))
        self._items += 1
        self._wake.set()

    def end(self, finished: bool) -> None:
        """The stream is over here (done, failed, or its client gone): its live marker goes;
        ``finished`` (its last output was sent) deletes the checkpoint too, otherwise it stays
        for a resume until its time to live runs out."""
        self._ended = finished
        self._end.set()
        self._wake.set()

    async def _write_loop(self) -> None:
        store = self.store
        try:
            while not self._broken:
                with contextlib.suppress(TimeoutError):  # else: time to renew the live marker
                    await asyncio.wait_for(self._wake.wait(), LIVE_RENEW_S)
                if self._ended is None and self._head_written and self._pending:
                    # Outputs wait up to WRITE_INTERVAL_S to share a round trip (a resume from
                    # a boundary before the last one the client heard regenerates the rest).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._end.wait(), WRITE_INTERVAL_S)
                self._wake.clear()
                batch, self._pending = self._pending, []
                ended = self._ended
                if ended:
                    if self._head_written:
                        with contextlib.suppress(RedisError, OSError, TimeoutError):
                            await asyncio.wait_for(
                                store.redis.delete(*self._written_keys()), TIMEOUT_S
                            )
                    return
                if batch or self._head_written:
                    await self._write(batch, live=ended is None)
                if ended is not None:
                    return
        finally:
            store._writers.discard(self)

    def _written_keys(self) -> list[str]:
        head, rows, _, live = _keys(self.token)
        return [head, rows, live]

    async def _write(self, batch: list[bytes], live: bool) -> None:
        """One round trip: the head (the first time), ``batch``, the live marker set
        (``live``) or deleted, the time to live renewed when a third of it has passed."""
        store = self.store
        head, rows, used, live_key = _keys(self.token)
        pipe = store.redis.pipeline(transaction=False)
        if not self._head_written:
            data = self._seal.seal(_encode_head(self._head), _head_field(self._owner))
            pipe.hset(head, mapping={"client": self._owner, "data": data})
            if self._unclaim:
                pipe.delete(used)
        if batch:
            pipe.rpush(rows, *batch)
        if live:
            pipe.set(live_key, store.node, px=int(LIVE_TTL_S * 1000))
        elif self._live:
            pipe.delete(live_key)
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
        if batch:
            store.metrics.checkpoint_writes.inc()
        self._head_written = True
        self._live = live
        if renew:
            self._renewed_at = now


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _encode_head(head: StreamHead) -> bytes:
    fields: dict[str, Any] = dataclasses.asdict(head) | {
        "request": _REQUEST.dump_python(head.request, mode="python")
    }
    return msgpack.packb(fields, use_bin_type=True)


def _decode(seal: StreamSeal, owner: str, data: bytes, items: list[bytes]) -> Checkpoint:
    """The checkpoint the claim answered, every item opened with ``seal``. Raises
    :class:`SealBroken` for an item that does not open, ``ValueError`` (or a pydantic
    ``ValidationError``, ``KeyError``, ``TypeError``) for one that does not decode."""
    fields = msgpack.unpackb(seal.open(data, _head_field(owner)), raw=False)
    request = _REQUEST.validate_python(fields["request"])
    head = StreamHead(
        str(fields["model"]), str(fields["client"]), str(fields["format"]),
        int(fields["sample_rate"]), request, _priority(fields.get("priority")),
    )  # fmt: skip
    parts: list[np.ndarray] = []
    boundaries: list[Boundary] = []
    last_write = 0.0
    for index, raw in enumerate(items):
        item = msgpack.unpackb(seal.open(raw, _rows_field(index)), raw=False)
        width = int(item["width"])
        rows = np.frombuffer(item["rows"], np.int32)
        parts.append(rows.reshape(-1, width) if width else np.zeros((0, 1), np.int32))
        boundaries.append(Boundary(int(item["frames"]), int(item["samples"])))
        last_write = float(item["at"])
    return Checkpoint(head, tuple(parts), tuple(boundaries), last_write)


def _priority(value: object) -> Priority:
    return value if value in PRIORITIES else "realtime"
