"""Loading Llama checkpoint directories: the flat audio layout end to end, and clear errors
for directories that cannot be served."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cadenza.config import EngineConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.registry import UnknownModelError, load_model
from cadenza.engine.offline import generate_ids
from tests.support.float32_compute import float32_cpu_config
from tests.unit.engine.llama_checkpoints import save_tiny_llama

OFFSET, CODES, K, EOS = 300, 1024, 8, 2
LAYOUT = {
    "layout": "flat",
    "num_codebooks": K,
    "codebook_size": CODES,
    "audio_token_offset": OFFSET,
    "audio_eos_id": EOS,
    "text_tokenizer": "bytes",
    "prompt_suffix_ids": [1],
}


@pytest.fixture(scope="module")
def flat_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("flat")
    config = LlamaConfig(
        vocab_size=OFFSET + K * CODES,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        eos_token_id=EOS,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    (directory / "cadenza.json").write_text(json.dumps(LAYOUT))
    return directory, model


def _allowed(step: int) -> list[int]:
    k = step % K
    ids = list(range(OFFSET + k * CODES, OFFSET + (k + 1) * CODES))
    return [*ids, EOS] if k == 0 else ids


def test_flat_layout_matches_transformers_with_the_same_constraints(flat_checkpoint):
    directory, reference = flat_checkpoint
    engine = Engine.from_pretrained(
        str(directory), cpu=float32_cpu_config(), kv_cache_memory_bytes=8 << 20
    )
    text = "hello"
    prompt = [*text.encode(), 1]
    greedy = SamplingParams(temperature=0.0, top_k=0)
    engine.add_request(SynthesisRequest("flat", text, max_duration_s=0.1, sampling=greedy))
    seq = engine.scheduler.waiting[-1]
    audio = []
    while engine.has_unfinished_requests():
        audio += [o.audio for o in engine.step()]
    frames = round(0.1 * 75)
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=frames * K,
            do_sample=False,
            prefix_allowed_tokens_fn=lambda _, ids: _allowed(ids.shape[0] - len(prompt)),
            eos_token_id=EOS,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert [row[0] for row in seq.output_rows] == expected
    assert sum(len(a) for a in audio) == len(expected) // K * 320
    engine.check_integrity()


def test_plain_checkpoint_cannot_synthesize(tmp_path):
    save_tiny_llama(tmp_path, "mha")
    engine = Engine.from_pretrained(str(tmp_path), kv_cache_memory_bytes=1 << 20)
    with pytest.raises(RequestRejected, match="text model"):
        engine.add_request(SynthesisRequest("x", "hello"))
    with pytest.raises(RequestRejected, match="prompt ids"):
        generate_ids(engine, [[1, 999]], 3)


def _write(directory, config=None, layout=None):
    save_tiny_llama(directory, "mha")
    if config is not None:
        current = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**current, **config}))
    if layout is not None:
        (directory / "cadenza.json").write_text(json.dumps(layout))
    return directory


@pytest.mark.parametrize(
    ("config", "layout", "message"),
    [
        ({"model_type": "gpt2"}, None, "model_type"),
        ({"attention_bias": True}, None, "attention_bias"),
        ({"hidden_act": "gelu"}, None, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, None, "rope type"),
        (None, {**LAYOUT, "bogus": 1}, "cadenza.json"),
        (None, {**LAYOUT, "layout": "spiral"}, "cadenza.json"),
        (None, LAYOUT, "outside the vocabulary"),  # the tiny vocab has no room for 8x1024 codes
    ],
)
def test_unsupported_checkpoints_are_refused_clearly(tmp_path, config, layout, message):
    directory = _write(tmp_path, config, layout)
    with pytest.raises(CheckpointError, match=message):
        load_model(str(directory), seed=0, device=torch.device("cpu"), dtype=torch.float32)


def test_garbage_files_are_refused(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\x00not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError):
        load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="not found"):
        load_model(str(empty), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(UnknownModelError):
        load_model("no/such/dir", seed=0, device=torch.device("cpu"), dtype=torch.float32)


def test_missing_weights_are_refused(tmp_path):
    directory = _write(tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="safetensors"):
        Engine.from_pretrained(
            str(directory), engine_config=EngineConfig(kv_cache_memory_bytes=1 << 20)
        )
