"""Weight norm's two spellings: legacy names mapped to the parametrisation's (nothing else
renamed, a mixture of both styles loading), and folding keeping the outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from cadenza.codecs.weight_norm import fold_weight_norm, parametrized_weight_norm_names
from tests.support.legacy_weight_norm import legacy_weight_norm_names


def _layers() -> nn.Sequential:
    """Two weight-normalised convolutions and a plain one."""
    return nn.Sequential(
        weight_norm(nn.Conv1d(2, 3, 3)),
        nn.ELU(),
        weight_norm(nn.Conv1d(3, 2, 1)),
        nn.Conv1d(2, 2, 1),
    )


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    model = _layers()
    with torch.no_grad():  # trained norms differ from the init's (which equal the weights' own)
        for name, parameter in model.named_parameters():
            if name.endswith("original0"):
                parameter.mul_(torch.rand_like(parameter) + 0.5)
    return model


def test_legacy_names_map_to_the_parametrisation_s_and_nothing_else_is_renamed() -> None:
    state = {
        "encoder.layers.0.conv.weight_g": 1,
        "encoder.layers.0.conv.weight_v": 2,
        "encoder.layers.0.conv.bias": 3,
        "decoder.conv.parametrizations.weight.original0": 4,
        "decoder.conv.parametrizations.weight.original1": 5,
        "decoder.lstm.weight_gate": 6,
        "decoder.weight_view.weight": 7,
        "weight_g": 8,
    }
    assert parametrized_weight_norm_names(state) == {
        "encoder.layers.0.conv.parametrizations.weight.original0": 1,
        "encoder.layers.0.conv.parametrizations.weight.original1": 2,
        "encoder.layers.0.conv.bias": 3,
        "decoder.conv.parametrizations.weight.original0": 4,
        "decoder.conv.parametrizations.weight.original1": 5,
        "decoder.lstm.weight_gate": 6,
        "decoder.weight_view.weight": 7,
        "parametrizations.weight.original0": 8,
    }


@pytest.mark.parametrize("legacy", ["every", "the first layer's", "none"])
def test_a_state_dict_in_either_or_both_styles_loads_the_same_model(legacy: str) -> None:
    model = _model()
    picks = {"every": lambda name: True, "the first layer's": lambda name: name.startswith("0.")}
    saved = legacy_weight_norm_names(model.state_dict(), picks.get(legacy, lambda name: False))
    assert any(name.endswith(".weight_g") for name in saved) == (legacy != "none")
    other = _layers()
    other.load_state_dict(parametrized_weight_norm_names(saved), strict=True)
    audio = torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(audio)
        assert torch.equal(other(audio), expected)
        assert fold_weight_norm(other) == 2 and not any("original" in n for n in other.state_dict())
        torch.testing.assert_close(other(audio), expected)


def test_a_tensor_named_both_ways_is_refused() -> None:
    state = {"conv.weight_g": 1, "conv.parametrizations.weight.original0": 2}
    with pytest.raises(ValueError, match=r"named both ways: conv\.weight_g and conv\.param"):
        parametrized_weight_norm_names(state)
    with pytest.raises(ValueError, match="named both ways"):
        parametrized_weight_norm_names(dict(reversed(state.items())))
