import pytest

from cadenza.config import LimitsConfig
from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis

OK = {
    "model": "cadenza-tiny",
    "text": "hello",
    "voice": "default",
    "max_duration_s": None,
    "served_model": "cadenza-tiny",
    "voices": ("default",),
    "limits": LimitsConfig(),
}


def test_valid_request_passes():
    validate_synthesis(**OK)
    validate_synthesis(**{**OK, "text": "x" * 4096, "max_duration_s": 300.0})


@pytest.mark.parametrize(
    ("change", "code", "status"),
    [
        ({"model": "gpt-4o-mini-tts"}, "model_not_found", 404),
        ({"voice": "alloy"}, "voice_not_found", 400),
        ({"text": "   "}, "empty_input", 400),
        ({"text": "x" * 4097}, "input_too_long", 400),
        ({"max_duration_s": 0.0}, "invalid_duration", 400),
        ({"max_duration_s": 301.0}, "invalid_duration", 400),
    ],
)
def test_each_problem_has_its_code(change, code, status):
    with pytest.raises(InvalidRequest) as caught:
        validate_synthesis(**{**OK, **change})
    assert (caught.value.code, caught.value.status) == (code, status)
    assert caught.value.message
