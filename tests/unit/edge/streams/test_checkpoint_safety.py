"""What a leaked resume token, or someone who reads or writes the fleet's Redis, can do with a
stream's checkpoint: nothing. In a real Redis (behind a password): a stream that still plays on
its node is not taken (``resume_live``) and goes on, while its own client resumes at once after
a dropped connection, and anyone after its node died; Redis holds none of the stream's content
in the clear; an altered, moved or foreign-secret checkpoint is refused (``resume_invalid``)
and reaches no engine; another key's client is refused, a client token its key minted is not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import redis

from cadenza.config import load_config
from cadenza.contract.request import ContextTurn, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.auth.client_tokens import ClientTokens, TokenScope
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.streams import checkpoints
from cadenza.edge.streams.checkpoint_seal import CheckpointSeal
from cadenza.edge.streams.checkpoints import (
    Checkpoint,
    CheckpointStore,
    ResumeRefused,
    StreamCheckpoint,
    StreamHead,
)
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.protocol import Resume
from cadenza.edge.streams.resume_token import new_token
from cadenza.edge.streams.stream_resume import claim_and_admit
from tests.support.redis_process import RedisServer, running_redis

SECRET = "a fleet's token secret, 32 characters or more"
REAL_LIVE_TIMES = (checkpoints.LIVE_TTL_S, checkpoints.LIVE_RENEW_S, checkpoints.LIVE_WAIT_S)
WORDS = "the words only this listener should ever read"
MICROPHONE = b"\x11MICROPHONE\x22" * 8
HEAD = StreamHead(
    model="cadenza-tiny",
    client="key:alice",
    format="pcm",
    sample_rate=24000,
    request=SynthesisRequest(
        "r1",
        WORDS,
        voice="a-voice-of-her-own",
        sampling=SamplingParams(temperature=0.7, seed=7),
        prompt_audio=MICROPHONE,
        context=(ContextTurn("the-other-voice", "what she said before", audio=MICROPHONE),),
    ),
)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis"), password="redis-password") as server:
        yield server


@pytest.fixture(autouse=True)
def quick_live_markers(monkeypatch) -> None:
    """Live markers that live 0.6 s, renewed every 0.2 s; a claim waits 0.9 s for one."""
    monkeypatch.setattr(checkpoints, "LIVE_TTL_S", 0.6)
    monkeypatch.setattr(checkpoints, "LIVE_RENEW_S", 0.2)
    monkeypatch.setattr(checkpoints, "LIVE_WAIT_S", 0.9)
    monkeypatch.setattr(checkpoints, "LIVE_POLL_S", 0.05)


def _store(server: RedisServer, secret: str = SECRET) -> CheckpointStore:
    return CheckpointStore(
        server.url, 60.0, "node-a", Metrics(), CheckpointSeal.from_secret(secret)
    )


def _output(start: int) -> StreamOutput:
    rows = np.arange(start, start + 36, dtype=np.int32).reshape(4, 9)
    return StreamOutput("r1", np.zeros(1280, np.float32), codes=np.zeros((2, 8)), rows=rows)


async def _playing(store: CheckpointStore, token: str, head: StreamHead = HEAD) -> StreamCheckpoint:
    """A stream that has had two outputs written and plays on."""
    writer = store.begin(token, head)
    writer.record(_output(0))
    writer.record(_output(36))
    await asyncio.sleep(0.1)
    return writer


async def _dropped(store: CheckpointStore, token: str, head: StreamHead = HEAD) -> None:
    """A stream whose client's connection dropped after two outputs."""
    writer = await _playing(store, token, head)
    writer.end(finished=False)
    await asyncio.sleep(0.1)


def _client(server: RedisServer) -> Any:  # bytes in, bytes out (redis-py's types say str)
    return redis.Redis(port=server.port, password=server.password)


# -- live streams ---------------------------------------------------------------------------


def test_a_live_stream_is_not_taken_goes_on_and_its_client_resumes_once_dropped(
    redis_server,
) -> None:
    token = new_token()

    async def scenario() -> tuple[ResumeRefused, float, Checkpoint]:
        store, thief = _store(redis_server), _store(redis_server)
        writer = await _playing(store, token)
        asked = time.monotonic()
        with pytest.raises(ResumeRefused) as live:
            await thief.claim(token, "key:alice")  # the token leaked, the key too even
        waited = time.monotonic() - asked
        writer.record(_output(72))  # the stream goes on, checkpointed
        await asyncio.sleep(0.6)
        writer.end(finished=False)  # then its client's connection drops
        claimed = await thief.claim(token, "key:alice")  # and it comes back at once
        for each in (store, thief):
            await each.close()
        return live.value, waited, claimed

    live, waited, claimed = asyncio.run(scenario())
    assert live.code == "resume_live" and live.status == 409
    assert waited >= 0.8  # past the marker's 0.6 s life: the stream's task renewed it
    np.testing.assert_array_equal(claimed.rows, np.arange(108, dtype=np.int32).reshape(12, 9))


def test_a_claim_waits_for_the_node_to_see_its_client_gone(redis_server) -> None:
    token = new_token()

    async def scenario() -> Checkpoint:
        store, other = _store(redis_server), _store(redis_server)
        writer = await _playing(store, token)
        claiming = asyncio.create_task(other.claim(token, "key:alice"))  # the client came back
        await asyncio.sleep(0.3)
        writer.end(finished=False)  # before its old node saw the connection drop
        claimed = await claiming
        for each in (store, other):
            await each.close()
        return claimed

    assert len(asyncio.run(scenario()).rows) == 8


def test_a_dead_nodes_marker_expires_and_its_stream_resumes(redis_server) -> None:
    token = new_token()

    async def scenario() -> Checkpoint:
        store, other = _store(redis_server), _store(redis_server)
        writer = await _playing(store, token)
        writer.task.cancel()  # the node died: nothing renews or deletes its marker
        claimed = await other.claim(token, "key:alice")
        for each in (store, other):
            await each.close()
        return claimed

    assert len(asyncio.run(scenario()).rows) == 8


def test_a_stream_over_here_leaves_no_marker(redis_server) -> None:
    dropped, finished = new_token(), new_token()

    async def scenario() -> None:
        store = _store(redis_server)
        await _dropped(store, dropped)
        writer = await _playing(store, finished)
        writer.end(finished=True)
        await asyncio.sleep(0.1)
        await store.close()

    asyncio.run(scenario())
    keys = {key.decode() for key in _client(redis_server).keys(f"*{dropped}*")}
    assert keys == {f"cadenza:stream:{{{dropped}}}:head", f"cadenza:stream:{{{dropped}}}:rows"}
    assert _client(redis_server).keys(f"*{finished}*") == []


def test_the_waits_fit_the_markers_life() -> None:
    """The real values (the fixture's are shorter): a marker is renewed several times in its
    life, and a claim waits past a whole life for a dead node's to expire."""
    ttl_s, renew_s, wait_s = REAL_LIVE_TIMES
    assert wait_s > ttl_s >= 2 * renew_s
    assert renew_s > checkpoints.WRITE_INTERVAL_S


# -- sealing --------------------------------------------------------------------------------


def test_redis_holds_nothing_of_the_stream_in_the_clear(redis_server) -> None:
    token = new_token()
    anonymous = new_token()

    async def scenario() -> None:
        store = _store(redis_server)
        await _dropped(store, token)
        await _dropped(store, anonymous, dataclasses.replace(HEAD, client="ip:203.0.113.9"))
        await store.close()

    asyncio.run(scenario())
    client = _client(redis_server)
    stored = b""
    for key in client.keys("cadenza:stream:*"):
        kind = client.type(key)
        if kind == b"hash":
            stored += b"".join(k + v for k, v in client.hgetall(key).items())
        elif kind == b"list":
            stored += b"".join(client.lrange(key, 0, -1))
        else:
            stored += client.get(key) or b""
    assert stored
    rows = np.arange(36, 72, dtype=np.int32).tobytes()
    for secret in (WORDS.encode(), b"listener", b"a-voice-of-her-own", b"what she said before",
                   MICROPHONE, b"MICROPHONE", rows, b"203.0.113.9", b"cadenza-tiny"):  # fmt: skip
        assert secret not in stored, secret
    assert client.hget(f"cadenza:stream:{{{anonymous}}}:head", "client") == b"open"


def _damage(server: RedisServer, token: str, other: str, how: str) -> None:
    client = _client(server)
    head, rows = f"cadenza:stream:{{{token}}}:head", f"cadenza:stream:{{{token}}}:rows"
    if how == "head-altered":
        data = bytearray(client.hget(head, "data"))
        data[-5] ^= 0x01
        client.hset(head, "data", bytes(data))
    elif how == "rows-altered":
        item = bytearray(client.lindex(rows, 1))
        item[20] ^= 0x01
        client.lset(rows, 1, bytes(item))
    elif how == "rows-reordered":
        first, second = client.lrange(rows, 0, 1)
        client.lset(rows, 0, second)
        client.lset(rows, 1, first)
    elif how == "rows-from-another-stream":
        client.lset(rows, 0, client.lindex(f"cadenza:stream:{{{other}}}:rows", 0))
    elif how == "head-from-another-stream":
        client.hset(head, "data", client.hget(f"cadenza:stream:{{{other}}}:head", "data"))
    elif how == "owner-changed":  # handed to anyone: the head no longer opens
        client.hset(head, "client", "open")


@pytest.mark.parametrize(
    "how",
    [
        "head-altered",
        "rows-altered",
        "rows-reordered",
        "rows-from-another-stream",
        "head-from-another-stream",
        "owner-changed",
    ],
)
def test_an_altered_checkpoint_is_refused(redis_server, how, caplog) -> None:
    token, other = new_token(), new_token()

    async def scenario() -> ResumeRefused:
        store = _store(redis_server)
        await _dropped(store, token)
        await _dropped(store, other)
        _damage(redis_server, token, other, how)
        with pytest.raises(ResumeRefused) as refused:
            await store.claim(token, "key:mallory" if how == "owner-changed" else "key:alice")
        assert len((await store.claim(other, "key:alice")).rows) == 8  # the other is whole
        await store.close()
        return refused.value

    with caplog.at_level(logging.WARNING):
        refused = asyncio.run(scenario())
    assert refused.code == "resume_invalid"
    assert any("does not open" in record.getMessage() for record in caplog.records)


def test_a_checkpoint_sealed_under_another_secret_is_refused(redis_server) -> None:
    token = new_token()

    async def scenario() -> ResumeRefused:
        store = _store(redis_server)
        await _dropped(store, token)
        foreign = _store(redis_server, "another fleet's secret, also 32 characters")
        with pytest.raises(ResumeRefused) as refused:
            await foreign.claim(token, "key:alice")
        for each in (store, foreign):
            await each.close()
        return refused.value

    assert asyncio.run(scenario()).code == "resume_invalid"


def test_nothing_of_an_altered_checkpoint_reaches_an_engine(redis_server) -> None:
    token = new_token()

    def no_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("an altered checkpoint reached admission")

    async def scenario() -> EdgeError:
        store = _store(redis_server)
        await _dropped(store, token)
        _damage(redis_server, token, token, "rows-altered")
        state = SimpleNamespace(checkpoints=store, metrics=Metrics(), service=no_engine)
        alice = Principal(kind="stream_key", client="key:alice", holder="key:alice")
        resume = Resume(type="resume", token=token, samples_heard=0)
        with pytest.raises(EdgeError) as refused:
            await claim_and_admit(state, resume, alice, "websocket")  # type: ignore[arg-type]
        await store.close()
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.code == "resume_invalid"


# -- owners ---------------------------------------------------------------------------------


def _token_principal(minter: str) -> Principal:
    """The principal a browser's client token, minted by ``minter``'s key, grants."""
    tokens = ClientTokens(SECRET)
    key = Principal(kind="stream_key", client=minter, holder=minter)
    minted, _ = tokens.mint(key, 60, TokenScope())
    return tokens.verify(minted)


def test_a_client_token_its_key_minted_resumes_and_another_keys_does_not(redis_server) -> None:
    token = new_token()

    async def scenario() -> tuple[ResumeRefused, ResumeRefused, Checkpoint]:
        store = _store(redis_server)
        await _dropped(store, token)
        with pytest.raises(ResumeRefused) as other_key:
            await store.claim(token, "key:mallory")
        with pytest.raises(ResumeRefused) as other_keys_token:
            await store.claim(token, _token_principal("key:mallory").client)
        claimed = await store.claim(token, _token_principal("key:alice").client)
        await store.close()
        return other_key.value, other_keys_token.value, claimed

    other_key, other_keys_token, claimed = asyncio.run(scenario())
    assert other_key.code == other_keys_token.code == "resume_forbidden"
    assert claimed.head == HEAD


# -- the secret -----------------------------------------------------------------------------


def test_without_the_token_secret_a_node_keeps_no_checkpoints(caplog) -> None:
    fleet = {"limits": {"redis_url": "redis://:pw@127.0.0.1:1/0"}}
    with caplog.at_level(logging.WARNING):
        assert checkpoints.checkpoint_store(load_config(overrides=fleet), Metrics()) is None
    assert any("auth.token_secret" in record.getMessage() for record in caplog.records)
    sealed = load_config(overrides={**fleet, "auth": {"token_secret": SECRET}})
    store = checkpoints.checkpoint_store(sealed, Metrics())
    assert isinstance(store, CheckpointStore)
    asyncio.run(store.close())
    assert checkpoints.checkpoint_store(load_config(), Metrics()) is None  # no Redis: no warning
