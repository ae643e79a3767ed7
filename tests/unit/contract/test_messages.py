"""The wire: every message kind survives encode/decode exactly, and nothing else decodes."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.contract import messages
from cadenza.contract.engine_stats import StepRecord, StepReport
from cadenza.contract.request import FinishReason, ResumePoint, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from tests.support.contract_examples import (
    NO_COMPILER_KERNELS,
    PRECISION,
    engine_info,
    engine_stats,
)

REQUEST = SynthesisRequest(
    "id1",
    "héllo",
    "default",
    2.5,
    SamplingParams(0.7, 10, 0.9, 42),
    prompt_audio=np.ones(4, "<f4").tobytes(),
)

EVERY_KIND = [
    messages.AddRequest(REQUEST),
    messages.AddRequest(
        SynthesisRequest("id3", "again", resume=ResumePoint(((1, 2), (3, 4)), frames_sent=1))
    ),
    messages.AbortRequest("id1"),
    messages.Shutdown(),
    messages.Ready(engine_info()),
    messages.Ready(engine_info(calibrated=False)),
    messages.Ready(engine_info(native_kernels=NO_COMPILER_KERNELS)),
    messages.Ready(engine_info(native_kernels=())),
    messages.Output("id2", np.arange(3, dtype="<f4").tobytes()),
    messages.Output("id4", b"", sent_s=1234.5),
    messages.Stats(
        engine_stats(1.25, spare_lead_s=0.75),
        StepReport((StepRecord(0.01, 4, 20, 4000), StepRecord(0.02, 8, 8, 800)), (0.12, -0.01)),
    ),
    messages.Probe(12, 400.0),
    messages.Probed(StepReport((StepRecord(0.01, 12, 12, 480),), codec_s=0.002), 12, "done"),
    messages.Probed(StepReport(), 0, "busy"),
    messages.Fatal("engine failed to load: no weights"),
    messages.Starting("calibrating (attempt 2 of 3)", 41.5),
    messages.Recalibrated(engine_info().calibration),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda m: m.type)
def test_every_kind_round_trips(message: messages.Message) -> None:
    assert messages.decode(messages.encode(message)) == message


def test_an_output_keeps_its_audio_and_codes_exact() -> None:
    audio = np.linspace(-1, 1, 999, dtype=np.float32)
    codes = np.arange(24, dtype=np.uint16).reshape(3, 8)
    rows = np.arange(-2, 10, dtype=np.int32).reshape(4, 3)
    output = StreamOutput(
        "id2", audio, FinishReason.ERROR, "boom", codes, error_code="internal", rows=rows
    )
    back = messages.decode(messages.encode(messages.Output.of(output)))
    assert isinstance(back, messages.Output)
    restored = back.stream_output()
    assert np.array_equal(restored.audio, audio) and np.array_equal(restored.codes, codes)
    assert np.array_equal(restored.rows, rows)
    assert (restored.finish_reason, restored.error, restored.error_code) == (
        FinishReason.ERROR,
        "boom",
        "internal",
    )


def test_an_output_keeps_the_time_it_was_sent() -> None:
    output = StreamOutput("id5", np.zeros(2, dtype=np.float32))
    back = messages.decode(messages.encode(messages.Output.of(output, sent_s=99.25)))
    assert isinstance(back, messages.Output) and back.sent_s == 99.25
    assert messages.Output.of(output).sent_s is None


def test_a_garbled_send_time_is_a_wire_error_naming_the_stream() -> None:
    raw = {"type": "output", "request_id": "id6", "audio": b"", "sent_s": "soon"}
    with pytest.raises(messages.WireError, match="sent_s") as caught:
        messages.decode(msgpack.packb(raw, use_bin_type=True))
    assert caught.value.request_id == "id6"


def test_torn_audio_is_refused() -> None:
    with pytest.raises(messages.WireError, match="torn"):
        messages.Output("x", b"\x00\x00\x00").stream_output()
    with pytest.raises(messages.WireError, match="torn"):
        messages.Output("x", b"", codes=b"\x00" * 6, num_codebooks=8).stream_output()
    with pytest.raises(messages.WireError, match="torn"):
        messages.Output("x", b"", rows=b"\x00" * 6, row_width=1).stream_output()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xc1",
        b"",
        msgpack.packb({"no": "type"}),
        msgpack.packb([1, 2]),
        msgpack.packb({"type": "output", "request_id": 3, "audio": b""}),
        msgpack.packb({"type": "add", "request": {"request_id": "r", "text": 1}}),
        msgpack.packb({"type": "stats", "stats": {}, "report": {}}),
        msgpack.packb({"type": "nope"}),
        msgpack.packb({"type": "probe", "batch": 0, "max_ms": 100.0}),
        msgpack.packb({"type": "probe", "batch": 4, "max_ms": -1.0}),
        msgpack.packb({"type": "probe", "batch": "many", "max_ms": 100.0}),
        msgpack.packb({"type": "probed", "report": {}, "batch": 1, "outcome": "whatever"}),
    ],
)
def test_garbage_is_refused_with_a_wire_error(garbage: bytes) -> None:
    with pytest.raises(messages.WireError):
        messages.decode(garbage)


@pytest.mark.parametrize(
    "precision",
    [
        {"weights": "float32", "products": "bfloat16", "kv_cache": "bf16", "codec": "none"},
        {**dataclasses.asdict(PRECISION), "chosen_by": "maybe"},
        {**dataclasses.asdict(PRECISION), "lowered": "everything"},
        {**dataclasses.asdict(PRECISION), "products": 16},
        "float32",
    ],
)
def test_a_garbled_precision_is_a_wire_error(precision: object) -> None:
    raw = msgpack.unpackb(messages.encode(messages.Ready(engine_info())))
    raw["info"]["precision"] = precision
    garbage = msgpack.packb(raw)
    with pytest.raises(messages.WireError):
        messages.decode(garbage)


def _ready_with_kernels(kernels: object) -> bytes:
    raw = msgpack.unpackb(messages.encode(messages.Ready(engine_info())))
    raw["info"]["native_kernels"] = kernels
    return msgpack.packb(raw, use_bin_type=True)


GOOD_KERNEL = {"library": "cpu_elu", "level": "native", "status": "loaded", "isa": "avx2"}


@pytest.mark.parametrize(
    "kernels",
    [
        "all of them",
        {"cpu_elu": "loaded"},
        [None],
        [{**GOOD_KERNEL, "status": "maybe"}],
        [{**GOOD_KERNEL, "isa": "pentium"}],
        [{**GOOD_KERNEL, "library": ""}],
        [{**GOOD_KERNEL, "library": 7}],
        [{**GOOD_KERNEL, "level": "x" * 65}],
        [{**GOOD_KERNEL, "detail": "x" * 2001}],
        [{"library": "cpu_elu", "level": "native"}],  # no status
        [GOOD_KERNEL] * 65,
    ],
)
def test_garbage_native_kernels_in_ready_are_a_wire_error(kernels: object) -> None:
    assert isinstance(messages.decode(_ready_with_kernels([GOOD_KERNEL])), messages.Ready)
    with pytest.raises(messages.WireError, match="native_kernels"):
        messages.decode(_ready_with_kernels(kernels))


def test_a_broken_add_still_names_its_request() -> None:
    data = msgpack.packb({"type": "add", "request": {"request_id": "r7", "text": None}})
    with pytest.raises(messages.WireError) as refused:
        messages.decode(data)
    assert refused.value.request_id == "r7"


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
# Maps that name a real kind, with fields that may or may not fit it.
typed_maps = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.sampled_from(["add", "abort", "shutdown", "ready", "output", "stats", "fatal"]),
    st.dictionaries(
        st.sampled_from(["request", "request_id", "audio", "info", "stats", "report", "message"]),
        wire_values,
        max_size=4,
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | (wire_values | typed_maps).map(msgpack.packb))
def test_arbitrary_bytes_decode_or_raise_a_wire_error(data: bytes) -> None:
    try:
        message = messages.decode(data)
    except messages.WireError:
        return
    assert messages.decode(messages.encode(message)) == message
