import torch

from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel, CadenzaTinySpec
from cadenza.engine.models.llama import LlamaBackboneConfig
from cadenza.engine.text_tokenizer import ByteTokenizer

SMALL = CadenzaTinySpec(
    backbone=LlamaBackboneConfig(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48
    ),
    num_codebooks=4,
    codebook_size=16,
)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = (CadenzaTinyModel.from_seed(s, SMALL) for s in (1, 1, 2))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.heads.weight, c.heads.weight)


def test_default_size_is_cpu_sized():
    spec = CadenzaTinySpec()
    assert 5e6 <= spec.backbone.num_parameters <= 10e6
    model = CadenzaTinyModel(spec)
    backbone = sum(p.numel() for p in model.backbone.parameters())
    assert backbone == spec.backbone.num_parameters


def test_cached_decoding_matches_full_recompute():
    """Incremental decoding with the KV cache equals recomputing the whole sequence."""
    model = CadenzaTinyModel.from_seed(0, SMALL)
    prompt = model.prompt_rows(ByteTokenizer().encode("hi there"))
    generator = torch.Generator().manual_seed(0)
    audio_rows = torch.randint(
        0, SMALL.codebook_size, (6, SMALL.num_codebooks), generator=generator
    )
    rows = torch.cat([prompt, audio_rows])
    with torch.no_grad():
        full = model(rows, torch.arange(len(rows)), model.new_kv_cache(len(rows)))
        cache = model.new_kv_cache(len(rows))
        pieces = [model(prompt, torch.arange(len(prompt)), cache)]
        for t in range(len(prompt), len(rows)):
            pieces.append(model(rows[t : t + 1], torch.tensor([t]), cache))
    torch.testing.assert_close(torch.cat(pieces), full, rtol=1e-4, atol=1e-5)
    assert full.shape == (len(rows), SMALL.num_codebooks, SMALL.audio_vocab_size)


def test_prompt_rows_put_text_in_column_zero():
    model = CadenzaTinyModel(SMALL)
    rows = model.prompt_rows([256, 104, 105])
    assert rows.shape == (4, SMALL.num_codebooks)
    assert rows[:3, 0].tolist() == [SMALL.audio_vocab_size + i for i in (256, 104, 105)]
    assert (rows[:3, 1:] == SMALL.pad_id).all()
    assert (rows[3] == SMALL.pad_id).all()  # begin-of-audio row


def test_eos_head_rows_are_zero():
    model = CadenzaTinyModel.from_seed(0, SMALL)
    heads = model.heads.weight.view(SMALL.num_codebooks, SMALL.audio_vocab_size, -1)
    assert heads[:, SMALL.eos_id].abs().sum() == 0
