"""``cadenza bench precision``: what the CPU's reduced precisions buy and what they cost, in one
run, so the CPU defaults (``cpu.linear_dtype``, ``cpu.codec_dtype``) rest on numbers.

* **Linear products** at the row counts of a decode step (1, 16 and 32 rows; the engine
  benchmark's Llama shapes): fp32 ``F.linear``, fp32 prepacked for oneDNN, bf16 prepacked (the
  CPU's bf16 matrix units where it has them) and W8A8 dynamic quantization (int8 weights with
  per-channel scales, activations quantized per call; ``torch.ao``'s fbgemm/x86 kernels, the
  VNNI path). Median microseconds per product.
* **Backbone accuracy**: the engine benchmark's random Llama in ``transformers`` (fp32) is the
  reference; each setting is a copy with its linears swapped. Teacher-forced logits of 8 random
  96-token sequences: cosine to the reference (mean and worst position) and top-1 agreement;
  and greedy continuations of 8 prompts (32 tokens): the share of tokens equal to the
  reference's before the first divergence. A random model's logits are nearly flat, so this is
  a harsh test: a trained model's margins are wider.
* **Codec**: the streaming EnCodec decoder (random weights) for 16 streams in 15-frame chunks,
  fp32 against bf16: milliseconds per stream-frame and the bf16 audio's SNR against fp32.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.bench.engine_throughput import MODEL, greedy_generate, reference_llama
from cadenza.codecs.encodec import load_encodec
from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder
from cadenza.kernels.cpu_linear import PackedLinear, bf16_packing_available, native_bf16_matmul
from cadenza.kernels.linear_swap import swap_linears

SHAPES = (
    (MODEL["hidden_size"], 3 * MODEL["hidden_size"]),  # fused q/k/v (upper bound)
    (MODEL["hidden_size"], 2 * MODEL["intermediate_size"]),  # fused gate/up
    (MODEL["intermediate_size"], MODEL["hidden_size"]),  # down
)
ROWS = (1, 16, 32)
SEQUENCES, SEQUENCE_LEN, GREEDY_TOKENS = 8, 96, 32
CODEC_STREAMS, CODEC_CHUNK, CODEC_CHUNKS = 16, 15, 8


def run(
    batch_sizes: tuple[int, ...] = ROWS, repeats: int = 3, progress: bool = False
) -> dict[str, Any]:
    """The three measurements; ``batch_sizes`` are the row counts of the linear products."""
    torch.manual_seed(0)
    linears = _linear_speeds(batch_sizes, repeats, progress)
    accuracy = _backbone_accuracy(progress)
    codec = _codec_cost(repeats)
    if progress:
        print(codec, flush=True)
    return {
        "benchmark": "precision",
        "native_bf16_matmul": native_bf16_matmul(),
        "threads": torch.get_num_threads(),
        "linear_us": linears,
        "backbone_accuracy": accuracy,
        "codec": codec,
    }


def _w8a8(module: nn.Module) -> nn.Module | None:
    """``module`` with its linears made W8A8 dynamic (per-channel int8 weights), or ``None``
    where this torch has no such kernels."""
    quantization = getattr(torch, "ao", None)
    if quantization is None or "x86" not in torch.backends.quantized.supported_engines:
        return None
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.backends.quantized.engine = "x86"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's eager quantization is deprecated
        return quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=False
        )


def _settings() -> dict[str, Callable[[nn.Module], nn.Module | None]]:
    def packed(dtype: torch.dtype) -> Callable[[nn.Module], nn.Module]:
        def swap(module: nn.Module) -> nn.Module:
            module = copy.deepcopy(module)
            swap_linears(module, lambda weight: PackedLinear(weight, dtype))
            return module

        return swap

    return {
        "fp32": lambda module: module,
        "fp32_packed": packed(torch.float32),
        # None where oneDNN cannot pack bf16 weights (an AVX2-only CPU)
        "bf16_packed": packed(torch.bfloat16) if bf16_packing_available() else lambda _: None,
        "w8a8_dynamic": _w8a8,
    }


def _median_us(fn: Callable[[], object], repeats: int, calls: int = 200) -> float:
    for _ in range(20):
        fn()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(1e6 * (time.perf_counter() - started) / calls)
    return statistics.median(runs)


@torch.inference_mode()
def _linear_speeds(rows: tuple[int, ...], repeats: int, progress: bool) -> list[dict[str, Any]]:
    results = []
    for in_features, out_features in SHAPES:
        layer = nn.Linear(in_features, out_features, bias=False)
        for count in rows:
            x = torch.randn(count, in_features)
            entry: dict[str, Any] = {"shape": [in_features, out_features], "rows": count}
            for name, make in _settings().items():
                module = make(nn.Sequential(layer))
                entry[name] = None if module is None else round(_time_module(module, x, repeats), 1)
            results.append(entry)
            if progress:
                print(entry, flush=True)
    return results


def _time_module(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    return _median_us(lambda: module(x), repeats)


@torch.inference_mode()
def _backbone_accuracy(progress: bool) -> dict[str, Any]:
    reference = reference_llama()
    ids = torch.randint(0, MODEL["vocab_size"], (SEQUENCES, SEQUENCE_LEN))
    expected = reference(ids).logits.float()
    prompts = ids[:, :16]
    expected_greedy = _greedy(reference, prompts)
    results: dict[str, Any] = {}
    for name, make in _settings().items():
        if name == "fp32":
            continue
        model: Any = make(reference)
        if model is None:
            results[name] = None
            continue
        logits = model(ids).logits.float()
        cosine = F.cosine_similarity(logits, expected, dim=-1)
        greedy = _greedy(model, prompts)
        results[name] = {
            "logits_cosine_mean": round(float(cosine.mean()), 6),
            "logits_cosine_min": round(float(cosine.min()), 6),
            "top1_agreement": round(
                float((logits.argmax(-1) == expected.argmax(-1)).float().mean()), 4
            ),
            "greedy_tokens_before_divergence": round(
                _agreement_before_divergence(greedy, expected_greedy), 4
            ),
        }
        if progress:
            print(name, results[name], flush=True)
    return results


def _greedy(model: Any, prompts: torch.Tensor) -> torch.Tensor:
    return greedy_generate(model, prompts, GREEDY_TOKENS)


def _agreement_before_divergence(tokens: torch.Tensor, expected: torch.Tensor) -> float:
    """Share of tokens, over all sequences, generated before the first one that differs."""
    same = 0
    for row, reference_row in zip(tokens.tolist(), expected.tolist(), strict=True):
        for token, reference_token in zip(row, reference_row, strict=True):
            if token != reference_token:
                break
            same += 1
    return same / expected.numel()


def _codec_cost(repeats: int) -> dict[str, Any]:
    codec = load_encodec("encodec_24khz", seed=0)
    frames = CODEC_CHUNK * CODEC_CHUNKS
    codes = torch.randint(0, codec.codebook_size, (CODEC_STREAMS, codec.num_codebooks, frames))
    outputs, costs = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        runs = []
        for _ in range(repeats):
            audio, seconds = _stream(EncodecStreamingDecoder(codec, CODEC_STREAMS, dtype), codes)
            runs.append(seconds)
        outputs[dtype], costs[dtype] = audio, statistics.median(runs)
    reference, reduced = outputs[torch.float32], outputs[torch.bfloat16]
    noise = float(((reduced - reference) ** 2).mean())
    snr_db = 10.0 * torch.log10(torch.tensor(float((reference**2).mean()) / max(noise, 1e-30)))
    per_frame = 1000.0 / (CODEC_STREAMS * frames)
    return {
        "streams": CODEC_STREAMS,
        "fp32_ms_per_stream_frame": round(costs[torch.float32] * per_frame, 4),
        "bf16_ms_per_stream_frame": round(costs[torch.bfloat16] * per_frame, 4),
        "bf16_snr_db": round(float(snr_db), 1),
    }


def _stream(decoder: EncodecStreamingDecoder, codes: torch.Tensor) -> tuple[torch.Tensor, float]:
    """All streams decoded chunk by chunk; ``(audio [streams, samples], seconds)``."""
    slots = [decoder.open() for _ in range(codes.shape[0])]
    pieces: dict[int, list[torch.Tensor]] = {slot: [] for slot in slots}
    started = time.perf_counter()
    for chunk in range(CODEC_CHUNKS):
        window = codes[:, :, chunk * CODEC_CHUNK : (chunk + 1) * CODEC_CHUNK]
        final = frozenset(slots) if chunk == CODEC_CHUNKS - 1 else frozenset()
        out = decoder.decode({slot: window[i] for i, slot in enumerate(slots)}, final)
        for slot in slots:
            pieces[slot].append(out[slot])
    seconds = time.perf_counter() - started
    return torch.stack([torch.cat(pieces[slot]) for slot in slots]), seconds
