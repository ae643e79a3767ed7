"""``cadenza bench engine``: the paged engine against ``transformers`` generate, same model,
same prompts, one run, plus the machine's roofline for a decode step. The engine runs twice:
with fp32 weights prepacked for oneDNN (the default on CPU) and with plain ``F.linear``. Each
repeat times the three one after the other; ``speedup`` is the median of the repeats' own
ratios (``speedup_per_round``), so drift between repeats does not enter it.

Model: a random Llama of 31 M parameters (hidden 512, 8 layers, 8 query / 2 KV heads, SwiGLU
1408, vocabulary 8192), fp32 on the CPU; prompts of 32 tokens, 128 new tokens, greedy, EOS
disabled so every run generates the same count. The engine runs at ``dtype``: ``float32``
(the default) is the reference's own precision, every product and the KV cache in float32;
``auto`` lets it choose (bf16 products where the CPU has native bf16: a different precision).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cadenza.bench.roofline import measure_gemm_flops, measure_roofline
from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

MODEL = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def run(
    batch_sizes: tuple[int, ...] = (1, 4, 16),
    prompt_len: int = 32,
    new_tokens: int = 128,
    repeats: int = 3,
    progress: bool = False,
    dtype: str = "float32",
) -> dict[str, Any]:
    torch.manual_seed(0)
    reference = reference_llama()
    num_params = sum(p.numel() for p in reference.parameters())
    weight_bytes = num_params * 4
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        max_tokens = max(batch_sizes) * (prompt_len + new_tokens)
        config = EngineConfig(
            page_size=16,
            max_num_seqs=max(batch_sizes),
            max_num_batched_tokens=max(512, max(batch_sizes) * prompt_len),
            enable_prefix_caching=False,
            kv_cache_memory_bytes=2 * max_tokens * engine_kv_bytes_per_token(),
        )
        engine = Engine.from_pretrained(directory, engine_config=config, dtype=dtype)
        unpacked = Engine.from_pretrained(
            directory, engine_config=config, dtype=dtype, cpu=CpuConfig(pack_weights=False)
        )
    roofline = measure_roofline()
    results = []
    for batch in batch_sizes:
        prompts = torch.randint(0, MODEL["vocab_size"], (batch, prompt_len)).tolist()
        # Round by round, the three side by side, so that the machine's drift (tens of per
        # cent over minutes on a shared host) moves every side of a ratio alike.
        hf_runs, runs, plain = [], [], []
        for _ in range(repeats):
            hf_runs.append(_time_transformers(reference, prompts, new_tokens))
            runs.append(_time_engine(engine, prompts, new_tokens))
            plain.append(_time_engine(unpacked, prompts, new_tokens))
        hf_s = statistics.median(hf_runs)
        ours_s = statistics.median(total for total, _ in runs)
        step_s = statistics.median(step for _, step in runs)
        plain_step_s = statistics.median(step for _, step in plain)
        round_ratios = [hf / total for hf, (total, _) in zip(hf_runs, runs, strict=True)]
        gemm_rate = measure_gemm_flops(batch, MODEL["intermediate_size"], MODEL["hidden_size"])
        bound_memory_s = weight_bytes / (roofline["read_bandwidth_gbps"] * 1e9)
        bound_compute_s = 2 * num_params * batch / (roofline["gemm_gflops_2048"] * 1e9)
        bound_s = max(bound_memory_s, bound_compute_s)
        entry = {
            "batch": batch,
            "transformers_tokens_per_s": batch * new_tokens / hf_s,
            "cadenza_tokens_per_s": batch * new_tokens / ours_s,
            "speedup": statistics.median(round_ratios),
            "speedup_per_round": [round(ratio, 3) for ratio in round_ratios],
            "transformers_ms_per_token_step": 1000 * hf_s / new_tokens,
            "cadenza_decode_step_ms": 1000 * step_s,
            "cadenza_unpacked_tokens_per_s": batch
            * new_tokens
            / statistics.median(total for total, _ in plain),
            "cadenza_unpacked_decode_step_ms": 1000 * plain_step_s,
            "roofline_step_ms": 1000 * bound_s,
            "roofline_memory_ms": 1000 * bound_memory_s,
            "roofline_compute_ms": 1000 * bound_compute_s,
            "step_over_roofline": step_s / bound_s,
            "gemm_gflops_at_this_batch": gemm_rate / 1e9,
        }
        results.append(entry)
        if progress:
            print(entry, flush=True)
    return {
        "benchmark": "engine",
        "model": {**MODEL, "parameters": num_params, "dtype": "float32"},
        "cadenza_dtype": dtype,
        "cadenza_precision": (
            None if engine.info.precision is None else engine.info.precision.describe()
        ),
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "roofline": roofline,
        "results": results,
    }


def reference_llama() -> Any:
    """The benchmark's random Llama (:data:`MODEL`) in ``transformers``, fp32, in eval mode,
    from torch's current random state."""
    config: Any = LlamaConfig(eos_token_id=None, bos_token_id=None, pad_token_id=None)
    for key, value in MODEL.items():
        setattr(config, key, value)
    config.head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    model: Any = LlamaForCausalLM(config)
    model.eval()
    return model


def greedy_generate(model: Any, ids: torch.Tensor, new: int) -> torch.Tensor:
    """``new`` greedy tokens after each row of ``ids`` (EOS never stops it): ``[B, new]``."""
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :]


def engine_kv_bytes_per_token() -> int:
    head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    return 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * head_dim * 4


def _time_transformers(model: Any, prompts: list[list[int]], new: int) -> float:
    ids = torch.tensor(prompts)
    started = time.perf_counter()
    out = greedy_generate(model, ids, new)
    elapsed = time.perf_counter() - started
    assert out.shape[1] == new
    return elapsed


def _time_engine(engine: Engine, prompts: list[list[int]], new: int) -> tuple[float, float]:
    """Total seconds for the whole batch, and the median decode-only step."""
    greedy = SamplingParams(temperature=0.0, top_k=0)
    started = time.perf_counter()
    seqs = [
        engine.add_tokens(f"bench-{i}-{time.monotonic_ns()}", [[t] for t in p], new, greedy)
        for i, p in enumerate(prompts)
    ]
    decode_steps = []
    while engine.has_unfinished_requests():
        step_started = time.perf_counter()
        engine.step()
        step = engine.telemetry.last_step
        if step is not None and step.tokens == step.decodes == len(prompts):
            decode_steps.append(time.perf_counter() - step_started)
    elapsed = time.perf_counter() - started
    assert all(seq.num_generated == new for seq in seqs)
    return elapsed, statistics.median(decode_steps)
