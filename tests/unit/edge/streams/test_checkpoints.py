"""Stream checkpoints in a real Redis: written as outputs arrive, claimed exactly once (also by
racing clients), refused for an unknown, used or another key's token, gone after their time to
live or at once when the stream finishes, put back when a resume cannot be served; and the
resume point a client's heard audio maps to."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import redis

from cadenza.contract.request import StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.streams.checkpoint_seal import CheckpointSeal
from cadenza.edge.streams.checkpoints import (
    Boundary,
    Checkpoint,
    CheckpointStore,
    ResumeRefused,
    StreamHead,
    resume_point,
    seeded,
)
from cadenza.edge.streams.resume_token import new_token
from tests.support.redis_process import RedisServer

HEAD = StreamHead(
    model="cadenza-tiny",
    client="key:alice",
    format="pcm",
    sample_rate=24000,
    request=SynthesisRequest(
        "r1",
        "hello there",
        sampling=SamplingParams(temperature=0.7, seed=7),
        prompt_audio=b"\0" * 8,
    ),
    priority="standard",
)


def _output(rows: int, frames: int, samples: int, start: int = 0) -> StreamOutput:
    return StreamOutput(
        "r1",
        np.zeros(samples, np.float32),
        codes=np.zeros((frames, 8), np.int64) if frames else None,
        rows=np.arange(start, start + rows * 9, dtype=np.int32).reshape(rows, 9),
    )


async def _write_three_outputs(store: CheckpointStore, token: str, head: StreamHead = HEAD):
    """Three outputs (4 rows each; the first two with 2 frames of 640 samples each)."""
    writer = store.begin(token, head)
    writer.record(_output(4, 2, 1280, 0))
    writer.record(_output(4, 2, 1280, 36))
    await asyncio.sleep(0.05)  # a round trip in flight: the next output waits its turn
    writer.record(_output(4, 0, 0, 72))
    return writer


SECRET = "a fleet's token secret, 32 characters or more"


def _store(
    server: RedisServer, ttl_s: float = 60.0, secret: str = SECRET
) -> tuple[CheckpointStore, Metrics]:
    metrics = Metrics()
    seal = CheckpointSeal.from_secret(secret)
    return CheckpointStore(server.url, ttl_s, "node-a", metrics, seal), metrics


def _keys(server: RedisServer) -> list[bytes]:
    return sorted(redis.Redis(port=server.port).keys("cadenza:stream:*"))


def test_a_checkpoint_is_claimed_whole_and_once(redis_server: RedisServer) -> None:
    token = new_token()

    async def scenario() -> tuple[Checkpoint, ResumeRefused]:
        store, _ = _store(redis_server)
        writer = await _write_three_outputs(store, token)
        writer.end(finished=False)  # the connection was lost: it stays for a resume
        await asyncio.sleep(0.1)
        claimed = await store.claim(token, "key:alice")
        with pytest.raises(ResumeRefused) as again:
            await store.claim(token, "key:alice")
        await store.close()
        return claimed, again.value

    claimed, again = asyncio.run(scenario())
    assert claimed.head == HEAD
    np.testing.assert_array_equal(claimed.rows, np.arange(108, dtype=np.int32).reshape(12, 9))
    assert claimed.boundaries == (Boundary(2, 1280), Boundary(4, 2560), Boundary(4, 2560))
    assert again.code == "resume_taken"
    assert [k.decode() for k in _keys(redis_server)] == [f"cadenza:stream:{{{token}}}:used"]


def test_of_two_clients_racing_on_one_token_exactly_one_wins(redis_server: RedisServer) -> None:
    token = new_token()

    async def scenario() -> list[object]:
        store, _ = _store(redis_server)
        writer = await _write_three_outputs(store, token)
        writer.end(finished=False)
        await asyncio.sleep(0.1)
        others = [_store(redis_server)[0] for _ in range(4)]
        outcomes = await asyncio.gather(
            *(other.claim(token, "key:alice") for other in others), return_exceptions=True
        )
        for other in (store, *others):
            await other.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert sum(isinstance(o, Checkpoint) for o in outcomes) == 1
    assert sorted(o.code for o in outcomes if isinstance(o, ResumeRefused)) == ["resume_taken"] * 3


@pytest.mark.parametrize(
    ("client", "token", "code"),
    [
        ("key:mallory", None, "resume_forbidden"),  # another API key's stream
        ("key:alice", "A" * 32, "resume_not_found"),  # a token nobody was given
    ],
)
def test_a_foreign_or_unknown_token_is_refused(redis_server, client, token, code) -> None:
    written = new_token()

    async def scenario() -> ResumeRefused:
        store, _ = _store(redis_server)
        writer = await _write_three_outputs(store, written)
        writer.end(finished=False)
        await asyncio.sleep(0.1)
        with pytest.raises(ResumeRefused) as refused:
            await store.claim(token or written, client)
        assert (await store.claim(written, "key:alice")).head == HEAD  # still there for Alice
        await store.close()
        return refused.value

    assert asyncio.run(scenario()).code == code


def test_without_api_keys_the_token_alone_proves_the_stream(redis_server: RedisServer) -> None:
    """A client without a key is named by its address, which may change on reconnecting."""
    token = new_token()

    async def scenario() -> Checkpoint:
        store, _ = _store(redis_server)
        anonymous = dataclasses.replace(HEAD, client="ip:10.0.0.1")
        writer = await _write_three_outputs(store, token, anonymous)
        writer.end(finished=False)
        await asyncio.sleep(0.1)
        claimed = await store.claim(token, "ip:10.0.0.99")
        await store.close()
        return claimed

    assert asyncio.run(scenario()).head.client == "ip:10.0.0.1"


def test_a_finished_stream_leaves_nothing_and_a_lost_one_expires(redis_server) -> None:
    finished, lost = new_token(), new_token()

    async def scenario() -> tuple[list[bytes], ResumeRefused]:
        store, _ = _store(redis_server, ttl_s=0.5)
        for token, done in ((finished, True), (lost, False)):
            writer = await _write_three_outputs(store, token)
            writer.end(finished=done)
        await asyncio.sleep(0.1)
        left = _keys(redis_server)
        await asyncio.sleep(0.6)  # the lost stream's time to live
        with pytest.raises(ResumeRefused) as expired:
            await store.claim(lost, "key:alice")
        await store.close()
        return left, expired.value

    left, expired = asyncio.run(scenario())
    assert {k.decode().split("}")[0].split("{")[1] for k in left} == {lost}
    assert expired.code == "resume_not_found"
    assert _keys(redis_server) == []


def test_a_claim_that_could_not_be_served_is_put_back(redis_server: RedisServer) -> None:
    token = new_token()

    async def scenario() -> tuple[Checkpoint, Checkpoint]:
        store, _ = _store(redis_server)
        writer = await _write_three_outputs(store, token)
        writer.end(finished=False)
        await asyncio.sleep(0.1)
        first = await store.claim(token, "key:alice")
        store.restore(token, first)  # no room here: the client may try another node
        await asyncio.sleep(0.1)
        second = await store.claim(token, "key:alice")
        await store.close()
        return first, second

    first, second = asyncio.run(scenario())
    np.testing.assert_array_equal(first.rows, second.rows)
    assert first.boundaries == second.boundaries and first.head == second.head


def test_redis_away_leaves_the_stream_unprotected_and_counted(tmp_path) -> None:
    async def scenario() -> tuple[float, ResumeRefused]:
        metrics = Metrics()
        seal = CheckpointSeal.from_secret(SECRET)
        store = CheckpointStore("redis://127.0.0.1:1/0", 60.0, "node-a", metrics, seal)
        writer = store.begin(new_token(), HEAD)
        writer.record(_output(4, 2, 1280))
        await asyncio.sleep(0.3)
        writer.end(finished=False)
        with pytest.raises(ResumeRefused) as refused:
            await store.claim(new_token(), "key:alice")
        await store.close()
        value = metrics.registry.get_sample_value("cadenza_checkpoint_failures_total")
        return value or 0.0, refused.value

    failures, refused = asyncio.run(scenario())
    assert failures == 2 and refused.code == "resume_unavailable"


CHECKPOINT = Checkpoint(
    HEAD,
    parts=(np.ones((4, 9), np.int32), np.ones((4, 9), np.int32), np.ones((2, 9), np.int32)),
    boundaries=(Boundary(2, 1280), Boundary(4, 2560), Boundary(6, 3840)),
    last_write=0.0,
)


@pytest.mark.parametrize(
    ("heard", "unit", "frames_sent", "drop"),
    [
        (0, "samples", 0, 0),  # nothing heard: from the start, after prefilling every row
        (1000, "samples", 0, 1000),  # inside the first output: from the start, 1000 dropped
        (1280, "samples", 2, 0),  # exactly at a boundary
        (3000, "samples", 4, 440),
        (5000, "samples", 6, 1160),  # past what was checkpointed: regenerated, then dropped
        (3, "frames", 2, 1),
    ],
)
def test_the_resume_point_is_the_last_boundary_heard(heard, unit, frames_sent, drop) -> None:
    point, at, dropped = resume_point(CHECKPOINT, heard, unit)
    assert (point.frames_sent, dropped) == (frames_sent, drop)
    assert at.frames == frames_sent and len(point.rows) == 10


def test_a_checkpointed_stream_gets_a_seed_of_its_own_and_keeps_one_it_has() -> None:
    unseeded = SynthesisRequest("r2", "hi")
    assert unseeded.sampling.seed is None
    drawn = {seeded(unseeded).sampling.seed for _ in range(50)}
    assert None not in drawn and len(drawn) == 50
    assert all(0 <= seed < 2**63 for seed in drawn if seed is not None)
    assert seeded(HEAD.request) is HEAD.request  # seed 7 stays
