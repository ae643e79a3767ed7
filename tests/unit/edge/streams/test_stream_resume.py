"""What a resumed stream drops of its continuation (the audio or frames its client already
has), the gap its first audio observes, and how a client's heard audio is counted."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from cadenza.contract.request import StreamOutput, SynthesisRequest
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.streams.checkpoints import Boundary, StreamHead
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.protocol import Resume
from cadenza.edge.streams.stream_resume import Resumed, _heard, claim_and_admit


def _output(samples: int, frames: int) -> StreamOutput:
    return StreamOutput(
        "r", np.arange(samples, dtype=np.float32), codes=np.arange(frames * 2).reshape(frames, 2)
    )


def test_the_samples_the_client_has_are_dropped_across_outputs() -> None:
    metrics = Metrics()
    resumed = Resumed(np.zeros((3, 9), np.int32), Boundary(2, 1280), 1000, "samples", time.time())
    first, resumed = resumed.pass_on(_output(640, 1), metrics)
    assert len(first.audio) == 0 and resumed.drop == 360
    second, resumed = resumed.pass_on(_output(640, 1), metrics)
    np.testing.assert_array_equal(second.audio, np.arange(360, 640, dtype=np.float32))
    third, resumed = resumed.pass_on(_output(640, 1), metrics)
    assert len(third.audio) == 640 and resumed.drop == 0
    gaps = metrics.registry.get_sample_value("cadenza_node_resume_gap_seconds_count")
    assert gaps == 1  # once, at the first output with audio


def test_frames_the_client_has_are_dropped_from_the_codes() -> None:
    resumed = Resumed(None, Boundary(0, 0), 3, "frames", None)
    first, resumed = resumed.pass_on(_output(1280, 2), Metrics())
    second, resumed = resumed.pass_on(_output(1280, 2), Metrics())
    assert first.codes is not None and len(first.codes) == 0
    assert second.codes is not None and second.codes.tolist() == [[2, 3]]
    assert resumed.drop == 0


HEAD = StreamHead("m", "ip:1", "pcm", 48000, SynthesisRequest("r", "hi"))


@pytest.mark.parametrize(
    ("head", "resume", "heard_rate", "expected"),
    [
        (HEAD, {"samples_heard": 48000}, None, ("samples", 24000)),  # at 48 kHz, codec 24 kHz
        (HEAD, {"samples_heard": 4800}, 48000, ("samples", 2400)),
        (StreamHead("m", "ip:1", "encodec", 24000, HEAD.request), {"frames_heard": 7}, None,
         ("frames", 7)),
        (StreamHead("m", "ip:1", "encodec", 24000, HEAD.request), {"samples_heard": 4800}, 48000,
         ("samples", 2400)),  # an encodec stream resumed on WebRTC plays audio
    ],
)  # fmt: skip
def test_heard_audio_is_counted_at_the_codecs_rate(head, resume, heard_rate, expected) -> None:
    message = Resume(type="resume", token="t" * 32, **resume)
    assert _heard(message, head, 24000, heard_rate) == expected


def test_the_other_measure_than_the_stream_counts_is_refused() -> None:
    message = Resume(type="resume", token="t" * 32, frames_heard=3)
    with pytest.raises(EdgeError) as refused:
        _heard(message, HEAD, 24000, None)
    assert refused.value.code == "invalid_message" and "samples_heard" in refused.value.message


def test_a_server_without_checkpoints_resumes_nothing() -> None:
    state = SimpleNamespace(checkpoints=None, metrics=Metrics())
    message = Resume(type="resume", token="t" * 32, samples_heard=0)
    with pytest.raises(EdgeError) as refused:
        asyncio.run(claim_and_admit(state, message, "ip:1", "websocket"))  # type: ignore[arg-type]
    assert refused.value.code == "resume_unavailable"
