"""The naive baseline engine: same model and sampler as the real engine, served one thread per
request with transformers' LlamaModel and offline codec decode."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.config import load_config
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import FinishReason, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.naive_engine import NaiveEngine, NaiveEngineError


def _drain(engine: NaiveEngine | Engine) -> tuple[np.ndarray, list[FinishReason]]:
    codes, reasons = [], []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.codes is not None and output.codes.size:
                codes.append(output.codes)
            if output.finish_reason is not None:
                reasons.append(output.finish_reason)
    return (np.concatenate(codes) if codes else np.zeros((0, 8))), reasons


def test_naive_tokens_equal_the_batching_engines(tiny_engine: Engine) -> None:
    naive = NaiveEngine.from_config(load_config(overrides={"engine": {"kind": "naive"}}))
    request = SynthesisRequest("same", "hello there", sampling=SamplingParams(seed=3))
    naive.add_request(request)
    naive_codes, naive_reasons = _drain(naive)
    tiny_engine.add_request(request)
    codes, reasons = _drain(tiny_engine)
    assert naive_reasons == reasons == [FinishReason.LENGTH]
    np.testing.assert_array_equal(naive_codes, codes)
    info = naive.info
    assert info.calibration is None and info.max_num_seqs >= 1
    assert info.realtime == tiny_engine.info.realtime  # the same chunk and length rules
    assert info.shape == tiny_engine.info.shape


def test_naive_engine_refuses_what_it_cannot_serve() -> None:
    naive = NaiveEngine.from_config(load_config(overrides={"engine": {"kind": "naive"}}))
    with pytest.raises(RequestRejected):
        naive.add_request(SynthesisRequest("v", "hi", voice="nobody"))
    naive.add_request(SynthesisRequest("c", "a long one " * 20))
    assert naive.abort_request("c")
    _, reasons = _drain(naive)
    assert reasons == [FinishReason.CANCELLED]
    assert not naive.abort_request("c")
    with pytest.raises(NaiveEngineError):
        NaiveEngine.from_config(
            load_config(overrides={"model": {"name": "/no/such/dir"}, "engine": {"kind": "naive"}})
        )
