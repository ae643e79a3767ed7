"""The backbone against Hugging Face's LlamaModel with the same random weights."""

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig
from cadenza.engine.sequence_kv_cache import SequenceKVCache


def _pair(num_heads, num_kv_heads):
    hf_config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=64 // num_heads,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    reference = LlamaModel(hf_config).eval()
    config = LlamaBackboneConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=64 // num_heads,
        intermediate_size=96,
    )
    ours = LlamaBackbone(config).eval()
    weights = {k: v for k, v in reference.state_dict().items() if not k.startswith("embed")}
    ours.load_state_dict(weights)
    return reference, ours, config


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (4, 1)])
def test_prefill_and_incremental_decode_match_transformers(num_heads, num_kv_heads):
    reference, ours, config = _pair(num_heads, num_kv_heads)
    embeddings = torch.randn(1, 12, 64)
    with torch.no_grad():
        expected = reference(inputs_embeds=embeddings).last_hidden_state[0]
        cache = SequenceKVCache(
            2, 12, num_kv_heads, config.head_dim, torch.float32, torch.device("cpu")
        )
        prefill = ours(embeddings[0, :7], torch.arange(7), cache)
        steps = [ours(embeddings[0, t : t + 1], torch.tensor([t]), cache) for t in range(7, 12)]
    got = torch.cat([prefill, *steps])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert cache.num_tokens == 12


def test_cache_overflow_is_refused():
    _, ours, config = _pair(4, 2)
    cache = SequenceKVCache(2, 4, 2, config.head_dim, torch.float32, torch.device("cpu"))
    with torch.no_grad(), pytest.raises(ValueError, match="exceeds"):
        ours(torch.randn(5, 64), torch.arange(5), cache)


def test_config_rejects_bad_head_grouping():
    with pytest.raises(ValueError):
        LlamaBackboneConfig(64, 1, num_heads=4, num_kv_heads=3, head_dim=16, intermediate_size=8)
