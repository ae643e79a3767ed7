"""The fused CPU decode against the torch layers it replaces: same hidden states and the same
keys and values stored, for the shapes the kernel takes (the comparisons at every
instruction-set level, ``isa_level``); the steps and models it does not take stay on torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig
from cadenza.kernels.attention_backends import attention_backend_for
from cadenza.kernels.attention_context import AttentionContext, PrefillSpan
from cadenza.kernels.cpu_linear import bf16_packing_available, pack_linears
from cadenza.kernels.fused_cpu_decode import FusedCpuDecode, unsupported_reason
from cadenza.kernels.int8_linear import quantize_linears
from cadenza.kernels.native import loader

PAGE = 4

needs_kernel = pytest.mark.skipif(
    loader.load("cpu_decode_layers") is None,
    reason="no C++ compiler on this machine: the fused decode is not built",
)


def backbone(
    heads: int = 4, kv_heads: int = 2, head_dim: int = 16, hidden: int = 64, seed: int = 0
) -> LlamaBackbone:
    torch.manual_seed(seed)
    model = LlamaBackbone(
        LlamaBackboneConfig(
            hidden_size=hidden,
            num_layers=3,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=96,
        )
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.2)
    model.fuse_projections()
    return model.eval()


def decode_step(
    model: LlamaBackbone,
    lengths: list[int],
    store: list[bool] | None = None,
    seed: int = 1,
    cache_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, AttentionContext, PagedKVCache]:
    """A cache holding random keys for sequences with ``lengths`` cached positions (the new
    token's included) on scattered pages, and one decode token per sequence."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    num_pages = sum(-(-n // PAGE) for n in lengths) + 7
    cache = PagedKVCache(config.kv_spec, num_pages, PAGE, cache_dtype, torch.device("cpu"))
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=generator))
    cache.values.copy_(torch.randn(cache.values.shape, generator=generator))
    order = torch.randperm(num_pages, generator=generator).tolist()
    tables, slots = [], []
    for i, length in enumerate(lengths):
        pages = [order.pop() for _ in range(-(-length // PAGE))]
        tables.append(pages)
        position = length - 1
        stored = store is None or store[i]
        slots.append(pages[position // PAGE] * PAGE + position % PAGE if stored else -1)
    width = max(len(t) for t in tables)
    context = AttentionContext(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        num_decodes=len(lengths),
        decode_page_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables]).int(),
        decode_seq_lens=torch.tensor(lengths, dtype=torch.int32),
        prefills=(),
    )
    embeddings = torch.randn(len(lengths), config.hidden_size, generator=generator)
    positions = torch.tensor([n - 1 for n in lengths])
    return embeddings, positions, context, cache


class _InputsInBf16(torch.nn.Linear):
    """A linear layer that rounds its inputs to bfloat16 first (what the kernel's bf16
    products do on a CPU with AVX512-BF16 dot products)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.bfloat16().float(), self.weight)


def multiply_like_the_kernel(model: LlamaBackbone, fused: FusedCpuDecode) -> None:
    """Make ``model``'s torch layers the kernel's bf16 reference: weights rounded to
    bfloat16, and the products' inputs too where the kernel rounds them."""
    for layer in model.layers:
        for parent, name in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        ):
            linear = getattr(parent, name)
            rounded = linear.weight.detach().bfloat16().float()
            if fused.rounds_activations:
                replacement = _InputsInBf16(rounded.shape[1], rounded.shape[0], bias=False)
                replacement.weight = torch.nn.Parameter(rounded, requires_grad=False)
                setattr(parent, name, replacement)
            else:
                linear.weight.data.copy_(rounded)


def run_both(
    model: LlamaBackbone, weight_dtype: torch.dtype, lengths: list[int], **kwargs
) -> tuple[tuple[torch.Tensor, PagedKVCache], tuple[torch.Tensor, PagedKVCache]]:
    """(fused hidden states and cache, torch's) for the same step from the same cache."""
    fused = FusedCpuDecode.build(model, weight_dtype)
    assert fused is not None
    embeddings, positions, context, cache = decode_step(model, lengths, **kwargs)
    reference_cache = PagedKVCache(
        model.config.kv_spec, cache.num_pages, PAGE, cache.dtype, torch.device("cpu")
    )
    reference_cache.keys.copy_(cache.keys)
    reference_cache.values.copy_(cache.values)
    with torch.inference_mode():
        model.fused_decode = fused
        assert fused.applies(embeddings, context, cache)
        ours = model(embeddings, positions, context, cache)
        model.fused_decode = None
        if weight_dtype == torch.bfloat16:
            multiply_like_the_kernel(model, fused)
        theirs = model(embeddings, positions, context, reference_cache)
    return (ours, cache), (theirs, reference_cache)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(4, 2, 16), (4, 4, 32), (6, 2, 64), (8, 2, 128), (4, 1, 48)],
)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_the_fused_layers_equal_the_torch_layers(
    heads, kv_heads, head_dim, weight_dtype, isa_level
):
    model = backbone(heads, kv_heads, head_dim)
    lengths = [1, 5, 16, 17, 40, 3]
    (ours, cache), (theirs, reference) = run_both(model, weight_dtype, lengths)
    if weight_dtype == torch.float32:
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-5)
    else:  # a sum's order can flip one bf16 rounding of an input: bf16's precision, not 1e-5
        scale = float(theirs.abs().max())
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-2 * scale)
    # The new keys and values are stored where the slot mapping says, nothing else changed.
    atol = 1e-5 if weight_dtype == torch.float32 else 5e-2
    np.testing.assert_allclose(cache.keys.numpy(), reference.keys.numpy(), atol=atol)
    np.testing.assert_allclose(cache.values.numpy(), reference.values.numpy(), atol=atol)


def attention_rounded_like_the_kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context: AttentionContext,
    scale: float,
) -> torch.Tensor:
    """Decode attention as the kernel's pair products compute it, in float64: the query
    rounded to bfloat16."""
    pages, page = k_cache.shape[0], k_cache.shape[1]
    keys = k_cache.reshape(pages * page, *k_cache.shape[2:]).double()
    values = v_cache.reshape(pages * page, *v_cache.shape[2:]).double()
    group = q.shape[1] // k_cache.shape[2]
    rows = []
    for i in range(context.num_decodes):
        length = int(context.decode_seq_lens[i])
        table = context.decode_page_tables[i].long()
        slots = table[torch.arange(length) // page] * page + torch.arange(length) % page
        query = q[i].bfloat16().double()  # [Hq, D]
        k = keys[slots].repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = values[slots].repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,lhd->hl", query, k) * scale
        weights = torch.exp(logits - logits.max(dim=1, keepdim=True).values)
        rows.append(torch.einsum("hl,lhd->hd", weights, v) / weights.sum(dim=1, keepdim=True))
    return torch.stack(rows).float()


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(4, 2, 64), (6, 2, 32), (4, 1, 128), (4, 2, 48)]
)
def test_bfloat16_products_over_a_bfloat16_cache_agree_with_torch(
    heads, kv_heads, head_dim, isa_level
):
    """The served CPU setting: bf16 products and a bf16 cache. Where the products round their
    inputs to bf16, attention rounds its query too and takes each key row's products in pairs
    from the cache (head widths a multiple of 32; 48 keeps widening the keys): torch's step
    with its products and its query rounded alike agrees to bf16's precision."""
    model = backbone(heads, kv_heads, head_dim)
    fused = FusedCpuDecode.build(model, torch.bfloat16)
    assert fused is not None
    backend = model._backends["cpu"] = attention_backend_for(torch.device("cpu"))
    plain_forward = backend.forward

    def rounded_like_the_kernel(q, k, v, k_cache, v_cache, context, scale, *rest):
        out = plain_forward(q, k, v, k_cache, v_cache, context, scale, *rest)  # stores k, v
        if fused.rounds_activations and head_dim % 32 == 0:
            return attention_rounded_like_the_kernel(q, k_cache, v_cache, context, scale)
        return out

    backend.forward = rounded_like_the_kernel
    lengths = [1, 2, 5, 16, 17, 40, 3, 100, 301]  # within and across pages
    (ours, _), (theirs, _) = run_both(model, torch.bfloat16, lengths, cache_dtype=torch.bfloat16)
    scale = float(theirs.abs().max())
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-2 * scale)


def test_the_rounded_reference_attention_is_torch_s_without_the_rounding():
    """The reference above, checked: with nothing to round (a query that bfloat16 holds
    exactly), it is the plain backend's attention."""
    model = backbone(4, 2, 64)
    _, _, context, cache = decode_step(model, [3, 17, 40])
    k_cache, v_cache = cache.layer(0)
    q = torch.randn(3, 4, 64).bfloat16().float()
    backend = attention_backend_for(torch.device("cpu"))
    for scale in (0.0, 0.125):
        plain = backend.forward(q, q[:, :2], q[:, :2], k_cache, v_cache, context, scale)
        ours = attention_rounded_like_the_kernel(q, k_cache, v_cache, context, scale)
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)


def rounded_differently(cache: PagedKVCache, reference: PagedKVCache, slot: int) -> bool:
    """Whether any layer stored the key or value of ``slot`` differently from torch."""
    page, offset = divmod(slot, PAGE)
    return any(
        not torch.equal(mine[:, page, offset], torchs[:, page, offset])
        for mine, torchs in ((cache.keys, reference.keys), (cache.values, reference.values))
    )


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 64), (6, 2, 32), (4, 1, 128)])
def test_a_bfloat16_cache_is_read_and_written_as_torch_does(heads, kv_heads, head_dim, isa_level):
    model = backbone(heads, kv_heads, head_dim)
    lengths = [1, 5, 16, 17, 40, 3, 100]
    (ours, cache), (theirs, reference) = run_both(
        model, torch.float32, lengths, cache_dtype=torch.bfloat16
    )
    # A row whose new key or value rounded to the other bfloat16 (see below) attends to a value
    # one bfloat16 step away from torch's: there the outputs agree to that step's share of
    # the attention, elsewhere to float32 rounding.
    _, _, context, _ = decode_step(model, lengths, cache_dtype=torch.bfloat16)
    flipped = torch.tensor(
        [rounded_differently(cache, reference, slot) for slot in context.slot_mapping.tolist()]
    )
    np.testing.assert_allclose(
        ours[~flipped].numpy(), theirs[~flipped].numpy(), rtol=2e-5, atol=2e-5
    )
    np.testing.assert_allclose(ours[flipped].numpy(), theirs[flipped].numpy(), rtol=0, atol=2e-3)
    # The new rows are rounded to bfloat16 as torch rounds them: equal bits, except where the
    # products' float32 sums (in another order) fell on the other side of a rounding boundary.
    assert cache.keys.dtype == torch.bfloat16
    stored = 2 * len(lengths) * kv_heads * head_dim
    differ = (cache.keys != reference.keys).sum() + (cache.values != reference.values).sum()
    assert int(differ) <= stored // 50
    for mine, torchs in ((cache.keys, reference.keys), (cache.values, reference.values)):
        torch.testing.assert_close(mine.float(), torchs.float(), rtol=8e-3, atol=1e-5)


@needs_kernel
def test_a_token_without_a_slot_is_not_stored():
    model = backbone()
    (ours, cache), (theirs, reference) = run_both(model, torch.float32, [6, 9], store=[True, False])
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-5)
    assert torch.equal(cache.keys, reference.keys) or torch.allclose(
        cache.keys, reference.keys, atol=1e-5
    )


def test_long_contexts_and_many_rows(isa_level):
    model = backbone(heads=4, kv_heads=2, head_dim=64)
    lengths = [300, 1, 129, 64, 65, 250, 7, 200, 33, 100, 17]
    (ours, _), (theirs, _) = run_both(model, torch.float32, lengths)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("rows", [8, 16, 19])
def test_paired_output_blocks_the_rows_left_and_an_odd_last_block_equal_torch(rows, isa_level):
    # Under AVX-512 full groups of rows take two blocks of 16 outputs at once; the rows left
    # over, and the last block of an odd count (80 and 112 outputs: 5 and 7 blocks), go one
    # block at a time.
    model = backbone(heads=5, kv_heads=1, head_dim=16, hidden=80)
    lengths = [(7 * i) % 40 + 1 for i in range(rows)]
    (ours, _), (theirs, _) = run_both(model, torch.float32, lengths)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-5)


@needs_kernel
def test_a_nan_stays_in_its_row():
    model = backbone()
    fused = FusedCpuDecode.build(model, torch.float32)
    assert fused is not None
    embeddings, positions, context, cache = decode_step(model, [5, 8])
    embeddings[1, 3] = float("nan")
    model.fused_decode = fused
    with torch.inference_mode():
        out = model(embeddings, positions, context, cache)
    assert torch.isfinite(out[0]).all()
    assert torch.isnan(out[1]).all()


def test_widths_the_kernel_does_not_take_are_refused():
    assert unsupported_reason(backbone()) is None
    assert "multiple of 16" in (unsupported_reason(backbone(hidden=72)) or "")
    assert "over 128" in (unsupported_reason(backbone(heads=2, kv_heads=1, head_dim=256)) or "")
    assert FusedCpuDecode.build(backbone(hidden=72), torch.float32) is None
    int8 = backbone()
    quantize_linears(int8)
    assert "int8" in (unsupported_reason(int8) or "")


@needs_kernel
def test_packed_linears_are_read_through_their_float32_weights():
    model = backbone()
    pack_linears(model, torch.bfloat16 if bf16_packing_available() else torch.float32)
    assert model.enable_fused_cpu_decode(torch.bfloat16)
    assert model.fused_decode is not None


@needs_kernel
def test_steps_the_kernel_does_not_take_stay_on_torch():
    model = backbone()
    fused = FusedCpuDecode.build(model, torch.float32)
    assert fused is not None
    embeddings, _, context, cache = decode_step(model, [5, 8])
    assert fused.applies(embeddings, context, cache)
    span = PrefillSpan(query_start=2, query_len=1, context_len=1, page_table=torch.zeros(1).int())
    with_prefill = AttentionContext(
        slot_mapping=context.slot_mapping,
        num_decodes=2,
        decode_page_tables=context.decode_page_tables,
        decode_seq_lens=context.decode_seq_lens,
        prefills=(span,),
    )
    assert fused.applies(embeddings, with_prefill, cache)  # prefill rows run fused too
    assert not fused.applies(embeddings.bfloat16(), context, cache)
    half_cache = PagedKVCache(
        model.config.kv_spec, cache.num_pages, PAGE, torch.float16, torch.device("cpu")
    )
    assert not fused.applies(embeddings, context, half_cache)
    assert not FusedCpuDecode.supports_cache(half_cache)


def test_without_a_compiler_the_backbone_stays_on_torch(no_compiler):
    model = backbone()
    assert not model.enable_fused_cpu_decode(torch.float32)
    assert model.fused_decode is None
    embeddings, positions, context, cache = decode_step(model, [3, 4])
    with torch.inference_mode():
        assert torch.isfinite(model(embeddings, positions, context, cache)).all()


def test_an_unknown_weight_dtype_is_refused():
    model = backbone()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        FusedCpuDecode(model, torch.float16, object())  # type: ignore[arg-type]


def test_a_step_with_a_prefill_chunk_runs_fused_each_prompt_row_causally(isa_level):
    model = backbone()
    fused = FusedCpuDecode.build(model, torch.float32)
    assert fused is not None
    embeddings, positions, context, cache = decode_step(model, [5, 9, 20])
    used = {int(p) for p in context.decode_page_tables.flatten() if p >= 0}
    free = [p for p in range(cache.num_pages) if p not in used][:2]  # 6 prompt rows: 2 pages
    prompt_slots = [free[i // PAGE] * PAGE + i % PAGE for i in range(6)]
    span = PrefillSpan(
        query_start=3, query_len=6, context_len=6, page_table=torch.tensor(free).int()
    )
    mixed = AttentionContext(
        slot_mapping=torch.cat([context.slot_mapping, torch.tensor(prompt_slots)]),
        num_decodes=3,
        decode_page_tables=context.decode_page_tables,
        decode_seq_lens=context.decode_seq_lens,
        prefills=(span,),
    )
    rows = torch.cat([embeddings, torch.randn(6, model.config.hidden_size)])
    at = torch.cat([positions, torch.arange(6)])
    reference = PagedKVCache(model.config.kv_spec, cache.num_pages, PAGE, torch.float32,
                             torch.device("cpu"))  # fmt: skip
    reference.keys.copy_(cache.keys)
    reference.values.copy_(cache.values)
    with torch.inference_mode():
        model.fused_decode = fused
        ours = model(rows, at, mixed, cache)
        model.fused_decode = None
        theirs = model(rows, at, mixed, reference)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cache.keys.numpy(), reference.keys.numpy(), atol=1e-5)


def test_prefill_chunks_alone_continuing_a_cached_prefix_equal_torch(isa_level):
    model = backbone(heads=6, kv_heads=2, head_dim=32)
    fused = FusedCpuDecode.build(model, torch.bfloat16)
    assert fused is not None
    config = model.config
    cache = PagedKVCache(config.kv_spec, 12, PAGE, torch.float32, torch.device("cpu"))
    cache.keys.normal_()
    cache.values.normal_()
    # Sequence A: positions 6..9 of 10 (6 cached before, on pages 3 and 7, then page 5);
    # sequence B: its first 5 positions, on pages 0 and 9.
    table_a, table_b = [3, 7, 5], [0, 9]
    slots_a = [table_a[p // PAGE] * PAGE + p % PAGE for p in range(6, 10)]
    slots_b = [table_b[p // PAGE] * PAGE + p % PAGE for p in range(5)]
    context = AttentionContext(
        slot_mapping=torch.tensor(slots_a + slots_b),
        num_decodes=0,
        decode_page_tables=torch.zeros(0, 1, dtype=torch.int32),
        decode_seq_lens=torch.zeros(0, dtype=torch.int32),
        prefills=(
            PrefillSpan(0, 4, 10, torch.tensor(table_a).int()),
            PrefillSpan(4, 5, 5, torch.tensor(table_b).int()),
        ),
    )
    rows = torch.randn(9, config.hidden_size)
    positions = torch.tensor([6, 7, 8, 9, 0, 1, 2, 3, 4])
    reference = PagedKVCache(config.kv_spec, 12, PAGE, torch.float32, torch.device("cpu"))
    reference.keys.copy_(cache.keys)
    reference.values.copy_(cache.values)
    with torch.inference_mode():
        model.fused_decode = fused
        ours = model(rows, positions, context, cache)
        model.fused_decode = None
        multiply_like_the_kernel(model, fused)
        theirs = model(rows, positions, context, reference)
    scale = float(theirs.abs().max())
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-2 * scale)
    np.testing.assert_allclose(cache.values.numpy(), reference.values.numpy(), atol=1e-2)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_big_steps_split_over_torchs_threads_give_the_same_result(threads):
    # Products of over 2**20 multiply-adds and rows attending over 2,048 positions in all
    # run on every thread torch is set to use.
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = backbone(heads=4, kv_heads=2, head_dim=64, hidden=256)
        lengths = [150 + 7 * i for i in range(24)]
        (ours, cache), (theirs, reference) = run_both(model, torch.float32, lengths)
        # Three layers of float32 sums in another order (products of 256 and 768 terms).
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(cache.keys.numpy(), reference.keys.numpy(), rtol=2e-4, atol=2e-4)
    finally:
        torch.set_num_threads(saved)
