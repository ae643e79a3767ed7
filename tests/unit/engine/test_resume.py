"""A stream resumed on another engine from its resume point goes on exactly as if it had never
stopped: the same rows (greedy and seeded), the same codes, the same audio after the gap."""

import numpy as np
import pytest

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams


def _outputs(engine, request, stop_after=None):
    """Outputs of ``request`` (all, or the first ``stop_after`` audio outputs, then abort)."""
    engine.add_request(request)
    outputs = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id != request.request_id:
                continue
            if stop_after is not None and len(outputs) == stop_after:
                continue  # the cancellation's ending
            outputs.append(output)
            if stop_after is not None and len(outputs) == stop_after:
                engine.abort_request(request.request_id)
    engine.check_integrity()
    return outputs


def _rows(outputs):
    return np.concatenate([o.rows for o in outputs if o.rows is not None])


def _codes(outputs):
    return np.concatenate([o.codes for o in outputs if o.codes is not None])


def _audio(outputs):
    return np.concatenate([o.audio for o in outputs])


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(seed=7)])
def test_resumed_stream_continues_the_uninterrupted_one(tiny_engine, sampling) -> None:
    text = "the stream that survives its engine"
    whole = _outputs(tiny_engine, SynthesisRequest("whole", text, sampling=sampling))
    head = _outputs(tiny_engine, SynthesisRequest("head", text, sampling=sampling), stop_after=3)
    point = ResumePoint(tuple(map(tuple, _rows(head).tolist())), len(_codes(head)))
    resumed = SynthesisRequest("head", text, sampling=sampling, resume=point)
    tail = _outputs(tiny_engine, resumed)

    assert tail[-1].finished and not tail[-1].error
    np.testing.assert_array_equal(np.concatenate([_rows(head), _rows(tail)]), _rows(whole))
    np.testing.assert_array_equal(np.concatenate([_codes(head), _codes(tail)]), _codes(whole))
    heard = _audio(head)
    np.testing.assert_allclose(np.concatenate([heard, _audio(tail)]), _audio(whole), atol=1e-5)


def test_resume_points_that_cannot_be_this_stream_are_refused(tiny_engine) -> None:
    width = tiny_engine.layout.num_codebooks
    bad_rows = [
        ResumePoint(((10**6,) * width,), 0),  # outside the vocabulary
        ResumePoint(((1,) * (width + 1),), 0),  # wrong width
        ResumePoint((), 5),  # frames heard that no row spells
    ]
    for index, point in enumerate(bad_rows):
        request = SynthesisRequest(f"bad{index}", "hello", resume=point)
        with pytest.raises(RequestRejected):
            tiny_engine.add_request(request)
    tiny_engine.check_integrity()
    assert not tiny_engine.has_unfinished_requests()
