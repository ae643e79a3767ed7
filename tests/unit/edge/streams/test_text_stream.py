"""A text stream's segments on one lease (:mod:`cadenza.edge.streams.text_stream`), with a
fake lease standing in for admission and the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import pytest

from cadenza.config import TextStreamConfig
from cadenza.contract.request import ContextTurn, FinishReason, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.text_stream import SegmentStarted, TextStream, WaitingForText


class FakeAdmission:
    def __init__(self) -> None:
        self.checked: list[str] = []

    async def check_segment(self, text: str, client: str) -> None:
        self.checked.append(text)
        if "forbidden" in text:
            raise EdgeError(400, "refused by the input guard", code="content_refused")


class FakeLease:
    """Each request speaks one frame of codes and ten samples per character."""

    def __init__(self, finish: FinishReason = FinishReason.EOS) -> None:
        self.admission = FakeAdmission()
        self.requests: list[SynthesisRequest] = []
        self.finished: str | None = None
        self.finish_with = finish
        self.charged: list[str] = []
        self.cut_reason: str | None = None
        self.sample_rate = 100  # ten samples per character: a tenth of a second each

    async def charge_segment(self, text: str) -> None:
        self.charged.append(text)

    def speak_next(self, request: SynthesisRequest) -> None:
        self.requests.append(request)

    def finish(self, reason: str) -> None:
        self.finished = reason

    async def outputs(self) -> AsyncGenerator[StreamOutput, None]:
        request = self.requests[-1]
        audio = np.ones(10 * len(request.text), np.float32)
        codes = np.full((1, 2), len(self.requests), np.uint16)
        yield StreamOutput(request.request_id, audio[:5], codes=codes)
        await asyncio.sleep(0)
        yield StreamOutput(request.request_id, audio[5:], finish_reason=self.finish_with)


CLIENT = Principal(kind="stream_key", client="key:client", holder="key:client")


def template(**fields: object) -> SynthesisRequest:
    return SynthesisRequest(request_id="stream", text="", voice="default", **fields)  # type: ignore[arg-type]


async def play(stream: TextStream, lease: FakeLease) -> list[object]:
    return [item async for item in stream.play(lease, CLIENT)]  # type: ignore[arg-type]


def test_segments_follow_each_other_on_one_lease_and_the_stream_ends_once():
    async def main():
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        lease = FakeLease()
        stream.append("First one. Second")
        stream.append(" one. Third")
        stream.end()
        return stream, lease, await play(stream, lease)

    stream, lease, items = asyncio.run(main())
    starts = [i for i in items if isinstance(i, SegmentStarted)]
    assert [s.text for s in starts] == ["First one. Second one.", "Third"]
    outputs = [i for i in items if isinstance(i, StreamOutput)]
    assert [o.finish_reason for o in outputs] == [None] * 4 + [FinishReason.EOS]
    assert sum(o.audio.size for o in outputs) == 10 * len("First one. Second one.Third")
    assert lease.finished == "eos" and stream.end_reason == "eos"
    assert lease.admission.checked == lease.charged == ["First one. Second one.", "Third"]
    assert len({r.request_id for r in lease.requests}) == 2


def test_a_stream_that_said_everything_says_it_waits_then_goes_on():
    async def main():
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        lease = FakeLease()
        stream.append("Early. ")
        items = []
        async for item in stream.play(lease, CLIENT):  # type: ignore[arg-type]
            items.append(item)
            if isinstance(item, WaitingForText):
                stream.append("Late.")
                stream.end()
        return items

    kinds = [type(i).__name__ for i in asyncio.run(main())]
    assert kinds.count("WaitingForText") == 1
    assert (
        kinds.index("WaitingForText") < [i for i, k in enumerate(kinds) if k == "SegmentStarted"][1]
    )


def test_no_text_for_the_idle_timeout_ends_the_stream_with_text_timeout():
    async def main():
        config = TextStreamConfig(idle_timeout_s=0.2)
        stream = TextStream(config, template(), takes_context=False)
        lease = FakeLease()
        stream.append("Only this. ")
        items = await play(stream, lease)
        return stream, lease, items

    stream, lease, items = asyncio.run(main())
    assert stream.end_reason == "text_timeout" and lease.finished == "text_timeout"
    assert isinstance(items[-1], StreamOutput) and items[-1].finish_reason is FinishReason.EOS


def test_more_segments_than_allowed_fail_the_stream():
    async def main():
        stream = TextStream(TextStreamConfig(max_segments=2), template(), takes_context=False)
        stream.append("A. ")
        stream.flush()
        items = []
        with pytest.raises(EdgeError) as failed:
            async for item in stream.play(FakeLease(), CLIENT):  # type: ignore[arg-type]
                items.append(item)
                if isinstance(item, WaitingForText):
                    stream.append("B. ")
                    stream.flush()
        return failed.value, items

    error, items = asyncio.run(main())
    assert error.code == "too_many_segments"
    assert sum(isinstance(i, SegmentStarted) for i in items) == 2


def test_a_segment_the_guard_refuses_fails_the_stream():
    async def main():
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        stream.append("Fine. Something forbidden. ")
        stream.end()
        with pytest.raises(EdgeError) as failed:
            await play(stream, FakeLease())
        return failed.value

    assert asyncio.run(main()).code == "content_refused"


def test_a_cancelled_or_failed_segment_ends_the_stream_with_it():
    async def main():
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        lease = FakeLease(FinishReason.CANCELLED)
        stream.append("One. Two. ")
        stream.end()
        return lease, await play(stream, lease)

    lease, items = asyncio.run(main())
    assert isinstance(items[-1], StreamOutput)
    assert items[-1].finish_reason is FinishReason.CANCELLED and lease.finished is None


def test_context_models_hear_the_earlier_segments_and_seeds_move_on():
    async def main():
        earlier = ContextTurn(voice="default", text="before", codes=((7, 7),))
        stream = TextStream(
            TextStreamConfig(context_segments=2),
            template(context=(earlier,), sampling=SamplingParams(seed=10)),
            takes_context=True,
        )
        lease = FakeLease()
        sentences = ["Two. ", "Three. ", "Four."]
        stream.append("One. ")
        async for item in stream.play(lease, CLIENT):  # type: ignore[arg-type]
            if isinstance(item, WaitingForText):
                stream.append(sentences.pop(0))
                if not sentences:
                    stream.end()
        return lease

    requests = asyncio.run(main()).requests
    assert [r.text for r in requests] == ["One.", "Two.", "Three.", "Four."]
    for index, request in enumerate(requests):
        assert request.sampling.seed == 10 + index
        assert request.context[0].text == "before"
        said = request.context[1:]
        assert [t.text for t in said] == [r.text for r in requests[max(index - 2, 0) : index]]
        assert all(t.codes for t in said)


def test_models_without_context_keep_the_template_context_and_prompt():
    async def main():
        stream = TextStream(
            TextStreamConfig(), template(prompt_audio=b"\0" * 8), takes_context=False
        )
        lease = FakeLease()
        stream.append("One. Two.")
        stream.end()
        await play(stream, lease)
        return lease.requests

    requests = asyncio.run(main())
    assert all(r.context == () and r.prompt_audio == b"\0" * 8 for r in requests)


def test_a_drain_ends_a_stream_that_waits_for_text():
    async def main():
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        lease = FakeLease()
        stream.append("Said. ")
        with pytest.raises(EdgeError) as ended:
            async for item in stream.play(lease, CLIENT):  # type: ignore[arg-type]
                if isinstance(item, WaitingForText):
                    lease.cut_reason = "the server is shutting down"
        return ended.value

    assert asyncio.run(main()).code == "shutting_down"


def test_a_whole_text_goes_sentence_by_sentence_only_to_a_model_that_asks_and_only_when_long():
    from dataclasses import replace

    from cadenza.config import CadenzaConfig
    from cadenza.edge.streams.text_stream import sentence_by_sentence
    from tests.support.contract_examples import engine_info

    config = CadenzaConfig()
    segmenting = replace(engine_info(), segments_text=True)
    three = replace(template(), text="One sentence here. Another one! And a third?")
    assert sentence_by_sentence(config, three, engine_info()) is None
    assert sentence_by_sentence(config, replace(template(), text="Just one."), segmenting) is None
    stream = sentence_by_sentence(config, three, segmenting)
    assert stream is not None
    lease = FakeLease()
    items = asyncio.run(play(stream, lease))
    starts = [i.text for i in items if isinstance(i, SegmentStarted)]
    assert starts == ["One sentence here.", "Another one!", "And a third?"]
    assert [r.text for r in lease.requests] == starts
    assert isinstance(items[-1], StreamOutput) and items[-1].finish_reason is FinishReason.EOS


def test_a_client_tokens_audio_per_stream_bounds_the_whole_text_stream():
    """Each segment may last what the stream has left, and the stream ends with ``length``
    once it has said it all, however much text still comes."""

    async def main():
        capped = Principal(
            kind="client_token", client="key:client", holder="token:t", max_audio_s=2.5
        )
        stream = TextStream(TextStreamConfig(), template(), takes_context=False)
        lease = FakeLease()
        stream.append("One sentence of text. " * 10)  # each segment: 2.2 s at 100 Hz
        stream.end()
        items = [item async for item in stream.play(lease, capped)]  # type: ignore[arg-type]
        return stream, lease, items

    stream, lease, _ = asyncio.run(main())
    said = [len(request.text) * 0.1 for request in lease.requests]  # the fake's audio
    lefts = [request.max_duration_s for request in lease.requests]
    assert lefts == pytest.approx([2.5 - sum(said[:i]) for i in range(len(said))])
    assert sum(said[:-1]) < 2.5 <= sum(said)  # no segment starts once it has all been said
    assert len(" ".join(r.text for r in lease.requests)) < len("One sentence of text. " * 10) - 1
    assert stream.end_reason == "length" and lease.finished == "length"
