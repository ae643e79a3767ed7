"""The drain: new streams refused with shutting_down once it starts, open streams waited for,
the ones left at the timeout cut, and a second drain waiting along with the first."""

import asyncio

import pytest

from cadenza.edge.server import lifecycle as lifecycle_module
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.streams.errors import EdgeError


class Stream:
    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.cut_reason: str | None = None
        lifecycle.opened(self)

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        self.lifecycle.closed(self)


def test_drain_refuses_new_streams_and_waits_for_open_ones() -> None:
    async def scenario() -> None:
        lifecycle = Lifecycle()
        lifecycle.check_open()
        stream = Stream(lifecycle)
        drain = asyncio.create_task(lifecycle.drain(5.0))
        await asyncio.sleep(0.01)
        with pytest.raises(EdgeError) as refused:
            lifecycle.check_open()
        assert refused.value.status == 503 and refused.value.code == "shutting_down"
        assert refused.value.headers["Retry-After"]
        assert not drain.done()
        lifecycle.closed(stream)  # it finished on its own
        assert await asyncio.wait_for(drain, 1) == 0
        assert stream.cut_reason is None

    asyncio.run(scenario())


def test_streams_left_at_the_timeout_are_cut_and_a_second_drain_waits_too() -> None:
    async def scenario() -> None:
        lifecycle = Lifecycle()
        streams = [Stream(lifecycle) for _ in range(2)]
        first = asyncio.create_task(lifecycle.drain(0.05))
        second = asyncio.create_task(lifecycle.drain(0.05))
        assert await first + await second == 2  # each stream cut once
        assert all(s.cut_reason and "shutting down" in s.cut_reason for s in streams)
        assert lifecycle.open_streams == 0

    asyncio.run(scenario())


class SlowToClose(Stream):
    """A transport that needs a moment to tell its client (or never closes)."""

    def __init__(self, lifecycle: Lifecycle, close_after_s: float | None) -> None:
        super().__init__(lifecycle)
        self.close_after_s = close_after_s

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        if self.close_after_s is not None:
            asyncio.get_running_loop().call_later(self.close_after_s, self.lifecycle.closed, self)


def test_the_drain_gives_cut_streams_a_bounded_moment_to_tell_their_clients(monkeypatch) -> None:
    monkeypatch.setattr(lifecycle_module, "CUT_GRACE_S", 0.3)

    async def scenario() -> None:
        lifecycle = Lifecycle()
        telling = SlowToClose(lifecycle, close_after_s=0.05)
        drain = asyncio.create_task(lifecycle.drain(0.01))
        await asyncio.sleep(0.03)
        assert telling.cut_reason and not drain.done()  # cut, still telling its client
        assert await asyncio.wait_for(drain, 1) == 1
        assert lifecycle.open_streams == 0
        stuck = SlowToClose(lifecycle, close_after_s=None)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(lifecycle.drain(0.01), 2) == 1  # bounded: returns anyway
        assert 0.25 < asyncio.get_running_loop().time() - started < 1.5
        assert stuck.cut_reason

    asyncio.run(scenario())


def test_the_drain_gives_up_the_nodes_share_of_the_host_as_it_begins(tmp_path) -> None:
    """A draining node frees its slot in the host's registry at once: a node started in its
    place while its streams finish takes the whole host, not what is left beside it."""
    from cadenza.contract.host_nodes import live_nodes, register_node

    node = register_node(tmp_path)
    assert list(live_nodes(tmp_path)) == [node.slot]

    async def scenario() -> None:
        lifecycle = Lifecycle()
        lifecycle.on_drain.append(node.close)
        stream = Stream(lifecycle)
        drain = asyncio.create_task(lifecycle.drain(5.0))
        await asyncio.sleep(0.01)
        assert live_nodes(tmp_path) == {} and not drain.done()  # gone before its streams end
        lifecycle.closed(stream)
        assert await asyncio.wait_for(drain, 1) == 0
        await lifecycle.drain(5.0)  # a second drain calls nothing again

    asyncio.run(scenario())
