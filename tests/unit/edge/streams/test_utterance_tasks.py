"""The playing utterances of a session: stopped on demand and waited for, forgotten when done."""

from __future__ import annotations

import asyncio

from cadenza.edge.streams.utterance_tasks import UtteranceTasks


def test_stop_cancels_and_waits_and_finished_ones_are_forgotten() -> None:
    async def scenario() -> None:
        released: list[int] = []

        async def utterance(stream_id: int, seconds: float) -> None:
            try:
                await asyncio.sleep(seconds)
            finally:
                released.append(stream_id)

        playing = UtteranceTasks()
        playing.start(1, utterance(1, 60))
        playing.start(2, utterance(2, 0))
        playing.start(3, utterance(3, 60))
        await asyncio.sleep(0.01)
        assert len(playing) == 2 and released == [2]  # 2 ended by itself
        await playing.stop(1)
        assert released == [2, 1] and len(playing) == 1  # stopped means let go already
        await playing.stop(1)  # unknown or done: nothing happens
        await playing.stop_all()
        assert released == [2, 1, 3] and len(playing) == 0

    asyncio.run(scenario())


def test_a_caller_cancelled_while_stopping_is_still_cancelled() -> None:
    async def scenario() -> None:
        async def stubborn() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.2)  # takes a while to let go

        playing = UtteranceTasks()
        playing.start(1, stubborn())
        await asyncio.sleep(0.01)
        stopper = asyncio.create_task(playing.stop(1))
        await asyncio.sleep(0.05)
        stopper.cancel()
        try:
            await stopper
        except asyncio.CancelledError:
            return
        raise AssertionError("the caller's own cancellation was swallowed")

    asyncio.run(scenario())
