import pytest

from cadenza.config import LimitsConfig
from cadenza.contract.sampling import SamplingParams
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
    ("change", "code"),
    [
        ({"model": "gpt-4o-mini-tts"}, "model_not_found"),
        ({"voice": "alloy"}, "voice_not_found"),
        ({"text": "   "}, "empty_input"),
        ({"text": "x" * 4097}, "input_too_long"),
        ({"max_duration_s": 0.0}, "invalid_duration"),
        ({"max_duration_s": 301.0}, "invalid_duration"),
    ],
)
def test_each_problem_has_its_code(change, code):
    with pytest.raises(InvalidRequest) as caught:
        validate_synthesis(**{**OK, **change})
    assert caught.value.code == code
    assert caught.value.message


@pytest.mark.parametrize(
    ("sampling", "declared", "refused"),
    [
        (SamplingParams(guidance_scale=3.0), (), "guidance_scale"),
        (SamplingParams(fine_temperature=0.5), ("guidance_scale",), "fine_temperature"),
        (SamplingParams(guidance_scale=3.0), ("guidance_scale",), None),
        (SamplingParams(), (), None),
    ],
)
def test_model_specific_sampling_fields_pass_only_where_the_model_declares_them(
    sampling, declared, refused
):
    change = {"sampling": sampling, "sampling_fields": declared}
    if refused is None:
        validate_synthesis(**OK, **change)
        return
    with pytest.raises(InvalidRequest) as caught:
        validate_synthesis(**OK, **change)
    assert caught.value.code == "unsupported_sampling_field"
    assert caught.value.param == refused and refused in caught.value.message
