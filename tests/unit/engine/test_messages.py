import numpy as np
import pytest

from cadenza.engine import messages
from cadenza.engine.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams


def test_request_round_trip():
    request = SynthesisRequest("id1", "héllo", "default", 2.5, SamplingParams(0.7, 10, 0.9, 42))
    wire = messages.pack(messages.add_message(request))
    assert messages.request_from_message(messages.unpack(wire)) == request


def test_output_round_trip_keeps_audio_exact():
    audio = np.linspace(-1, 1, 999, dtype=np.float32)
    output = StreamOutput("id2", audio, FinishReason.EOS)
    back = messages.output_from_message(
        messages.unpack(messages.pack(messages.output_message(output)))
    )
    assert back.request_id == "id2"
    assert back.finish_reason is FinishReason.EOS
    assert np.array_equal(back.audio, audio)


def test_info_round_trip():
    info = messages.EngineInfo("cadenza-tiny", ("default",), 24000, 75.0, "cpu")
    assert (
        messages.info_from_message(messages.unpack(messages.pack(messages.info_message(info))))
        == info
    )


@pytest.mark.parametrize("garbage", [b"\xc1", messages.pack({"no": "type"}), messages.pack([1, 2])])
def test_garbage_is_refused(garbage):
    with pytest.raises(ValueError):
        messages.unpack(garbage)
