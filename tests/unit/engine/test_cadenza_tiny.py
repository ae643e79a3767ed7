"""cadenza-tiny: deterministic construction, and the paged engine against a plain
full-recompute implementation of the same model."""

import pytest
import torch
import torch.nn.functional as F

from cadenza.config import CpuConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel, CadenzaTinySpec
from cadenza.engine.models.llama import apply_rotary
from cadenza.engine.sequence import Sequence
from cadenza.kernels.cpu_linear import PackedLinear, bf16_packing_available
from tests.support.float32_compute import float32_cpu_config

GREEDY = SamplingParams(temperature=0.0, top_k=0)


def _full_recompute_logits(model: CadenzaTinyModel, rows: list[list[int]]) -> torch.Tensor:
    """Last-position logits from the whole sequence, with plain causal attention."""
    ids = torch.tensor(rows)
    x = sum(model.embed_codebooks[k](ids[:, k]) for k in range(ids.shape[1]))
    cos, sin = model.backbone.rotary(torch.arange(len(rows)))
    for layer in model.backbone.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rotary(attn.q_proj(h).view(len(rows), attn.num_heads, -1), cos, sin)
        k = apply_rotary(attn.k_proj(h).view(len(rows), attn.num_kv_heads, -1), cos, sin)
        v = attn.v_proj(h).view(len(rows), attn.num_kv_heads, -1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        ).transpose(0, 1)
        x = x + attn.o_proj(out.reshape(len(rows), -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    hidden = model.backbone.norm(x)[-1:]
    return model.heads(hidden).view(model.spec.num_codebooks, model.spec.audio_vocab_size)


def _reference_rows(model, prompt, target_frames):
    """Greedy generation by full recompute, applying the layout's masks and forced ids."""
    layout = model.layout
    seq = Sequence("ref", [list(r) for r in prompt], GREEDY, torch.Generator(), 10**6)
    seq.target_frames = target_frames
    masks = layout.sampling_masks()[0]
    with torch.no_grad():
        while True:
            logits = _full_recompute_logits(model, seq.token_rows)
            _, forced = layout.constraints(seq)
            row = logits.masked_fill(~masks, float("-inf")).argmax(-1).tolist()
            if forced is not None:
                row = [f if f is not None else r for f, r in zip(forced, row, strict=True)]
            seq.append(row)
            seq.end_frame, reason = layout.on_row(seq, row)
            if reason is not None:
                return seq.output_rows


def test_paged_engine_matches_full_recompute():
    model = CadenzaTinyModel.from_seed(0)  # the reference; the engine builds its own (fused)
    engine = Engine.from_pretrained(
        "cadenza-tiny",
        cpu=float32_cpu_config(),
        seed=0,
        page_size=8,
        kv_cache_memory_bytes=8 << 20,
        max_num_batched_tokens=24,
        max_num_seqs=4,
    )
    texts = {"a": "Hello there.", "b": "A longer sentence, to stagger the streams."}
    seqs = {}
    for request_id, text in texts.items():
        engine.add_request(SynthesisRequest(request_id, text, max_duration_s=0.2, sampling=GREEDY))
        seqs[request_id] = engine.scheduler.waiting[-1]
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    for request_id, text in texts.items():
        prompt = model.build_prompt(text, "default")
        assert seqs[request_id].output_rows == _reference_rows(model, prompt, target_frames=15)
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages


def test_same_seed_same_weights_other_seed_other_weights():
    small = CadenzaTinySpec(num_codebooks=2, codebook_size=16)
    a, b, c = (CadenzaTinyModel.from_seed(s, small) for s in (1, 1, 2))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.heads.weight, c.heads.weight)


def test_default_size_is_cpu_sized():
    spec = CadenzaTinySpec()
    assert 5e6 <= spec.backbone.num_parameters <= 10e6
    model = CadenzaTinyModel(spec)
    assert sum(p.numel() for p in model.backbone.parameters()) == spec.backbone.num_parameters


def test_prompt_puts_text_in_column_zero():
    spec = CadenzaTinySpec()
    rows = CadenzaTinyModel(spec).build_prompt("hi", "default")
    assert len(rows) == 4  # BOS, 'h', 'i', begin-of-audio
    assert [r[0] for r in rows[:3]] == [spec.audio_vocab_size + i for i in (256, 104, 105)]
    assert all(r[1:] == [spec.pad_id] * 7 for r in rows[:3])
    assert rows[3] == [spec.pad_id] * 8


def test_eos_head_rows_are_zero():
    spec = CadenzaTinySpec(num_codebooks=2, codebook_size=16)
    model = CadenzaTinyModel.from_seed(0, spec)
    heads = model.heads.weight.view(spec.num_codebooks, spec.audio_vocab_size, -1)
    assert heads[:, spec.eos_id].abs().sum() == 0


@pytest.mark.skipif(not bf16_packing_available(), reason="oneDNN packs no bf16 weights here")
def test_bf16_outputs_left_to_promoting_consumers_change_no_token():
    """With bf16 products, leaving their outputs in bf16 for the ops that promote them
    (residual adds, rotary, the KV store, SiLU) gives the tokens of converting every output
    back to float32 first: the promotion is exact."""
    cpu = CpuConfig(linear_dtype="bfloat16", codec_dtype="float32")
    text = "A sentence long enough for a prefill that takes the packed products."
    rows = []
    for keep in (True, False):
        engine = Engine.from_pretrained(
            "cadenza-tiny", cpu=cpu, seed=0, kv_cache_memory_bytes=8 << 20
        )
        packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
        assert any(m.keep_compute_dtype for m in packed)
        for module in packed:
            module.keep_compute_dtype = module.keep_compute_dtype and keep
        for index in range(3):
            engine.add_request(
                SynthesisRequest(f"r{index}", text[index:], max_duration_s=0.3, sampling=GREEDY)
            )
        seqs = list(engine.scheduler.waiting)
        while engine.has_unfinished_requests():
            engine.step()
        rows.append([seq.output_rows for seq in seqs])
    assert rows[0] == rows[1]
