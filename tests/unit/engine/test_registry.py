"""The family registry: each checkpoint goes to the first family that recognises it, every
loaded model has what its family record says, and a new family is one module plus one line of
the table (tests/support/example_family.py)."""

from __future__ import annotations

import json

import pytest
import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models import registry
from cadenza.engine.models.checkpoint import CheckpointError
from tests.support import example_family
from tests.unit.engine.llama_checkpoints import save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, top_k=0)


def test_the_table_names_each_family_once() -> None:
    names = [family.name for family in registry.FAMILIES]
    assert len(names) == len(set(names)) and {"llama", "orpheus", "csm"} <= set(names)
    assert names.index("orpheus") < names.index("llama")  # the more specific one first


def test_an_unrecognised_checkpoint_names_the_families(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="families: csm, orpheus, llama"):
        registry.family_of(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        registry.family_of(tmp_path)


@pytest.fixture
def with_example_family(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one line a new family adds to the registry's table.
    monkeypatch.setattr(registry, "FAMILIES", (example_family.FAMILY, *registry.FAMILIES))


def _reference_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens, each restricted to its position's codes (+ end of speech
    at a frame's start), as the family declares."""
    ids, out = list(prompt), []
    codes = example_family.CODES
    for step in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        position = step % codes["num_codebooks"]
        start = codes["audio_token_offset"] + position * codes["codebook_size"]
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        allowed[start : start + codes["codebook_size"]] = True
        if position == 0:
            allowed[codes["audio_eos_id"]] = True
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        if token == codes["audio_eos_id"]:
            break
        out.append(token)
        ids.append(token)
    return out


def test_a_new_family_is_one_module_and_one_line(tmp_path, with_example_family) -> None:
    reference = save_tiny_llama(tmp_path, "gqa3")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "architectures": ["LlamaCodesForSpeech"]})
    )
    assert registry.family_of(tmp_path) is example_family.FAMILY
    engine = Engine.from_pretrained(
        str(tmp_path), dtype="float32", page_size=4, kv_cache_memory_bytes=4 << 20
    )
    assert engine.model.family == "llama-codes"
    heads = engine.model.restricted_outputs
    assert heads is not None and [len(ids) for ids in heads.ids] == [17] + [16] * 7
    prompts = [[1, 7, 9, 30], [1, 50, 51]]
    rows = [[[token] for token in prompt] for prompt in prompts]
    seqs = [engine.add_tokens(f"r{i}", r, 24, GREEDY) for i, r in enumerate(rows)]
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_integrity()
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert [row[0] for row in seq.output_rows] == _reference_greedy(reference, prompt, 24)


@pytest.mark.parametrize("name", ["llama", "orpheus", "csm", "pocket_tts"])
def test_a_loaded_model_has_what_its_family_says(name, tmp_path) -> None:
    if name == "pocket_tts":
        from tests.support.pocket_tts_checkpoints import write_pocket_tts_checkpoint

        write_pocket_tts_checkpoint(tmp_path)
    elif name == "orpheus":
        from tests.unit.engine.orpheus_checkpoints import save_tiny_orpheus

        save_tiny_orpheus(tmp_path)
    elif name == "csm":
        from tests.unit.engine.csm_checkpoints import save_tiny_csm

        save_tiny_csm(tmp_path)
    else:
        save_tiny_llama(tmp_path, "gqa3")
    family = registry.family_of(tmp_path)
    assert family.name == name
    model = registry.load_checkpoint(tmp_path, torch.device("cpu"), torch.float32)
    assert (model.depth is not None) == family.depth_decoder
    assert model.takes_context == family.takes_context
    speaks = model.layout.produces_audio
    assert (model.restricted_outputs is not None) == (family.restricted_outputs and speaks)
    shape = registry.paged_backbone_config(str(tmp_path))
    assert shape.kv_spec == model.kv_spec
