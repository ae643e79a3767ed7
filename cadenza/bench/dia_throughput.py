"""``cadenza bench dia``: a Dia-shaped guided encoder-decoder served by the engine against
``transformers``' ``DiaForConditionalGeneration.generate`` on the same batch, same weights,
one run.

Model: random weights in Dia's layout (a byte text encoder, a decoder over 9 codebooks of 1,028
ids in Dia's delay pattern, cross-attention, classifier-free guidance at scale 3 with its
top-k filter); ``shape="dia-small"`` a decoder of 6 layers at hidden 1024 and an encoder of 4
at 512, ``"dia-1.6b"`` the public model's size, ``"dia-tiny"`` a smoke run. Weights fp32,
both sides greedy; the codec is a small random DAC (the step is what is measured; the codec
has its own benchmark).

Measured per batch size ``B``: ``transformers`` generates ``B`` texts at once for ``frames``
frames (its two guidance branches batched, as it runs them) and reports frames per second over
the batch; the engine runs ``B`` streams of the same texts and reports its median guided decode
step (both branches of every stream, the guidance mix and the sampling) and the frames per
second it makes, and whether the step fits in the frame period (11.6 ms at 86.1 frames a
second: every stream keeps up).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine


def _stacks(encoder: tuple[int, int, int], decoder: tuple[int, int, int], heads: int) -> Any:
    """Dia's heads (16 query heads; the decoder's 4 key/value heads; cross-attention 16/16) at
    the given ``(hidden, intermediate, layers)`` of each stack."""
    enc_hidden, enc_inter, enc_layers = encoder
    dec_hidden, dec_inter, dec_layers = decoder
    return {
        "encoder": {
            "hidden_size": enc_hidden,
            "intermediate_size": enc_inter,
            "num_hidden_layers": enc_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": enc_hidden // heads,
        },
        "decoder": {
            "hidden_size": dec_hidden,
            "intermediate_size": dec_inter,
            "num_hidden_layers": dec_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads // 4,
            "head_dim": dec_hidden // heads,
            "cross_num_attention_heads": heads,
            "cross_num_key_value_heads": heads,
            "cross_head_dim": dec_hidden // heads,
            "cross_hidden_size": enc_hidden,
        },
    }


SHAPES: dict[str, Any] = {
    "dia-1.6b": _stacks((1024, 4096, 12), (2048, 8192, 18), 16),
    "dia-small": _stacks((512, 2048, 4), (1024, 4096, 6), 16),
    "dia-tiny": _stacks((64, 128, 1), (64, 128, 2), 8),
}
TEXT = "[S1] Dia speaks one line of a dialogue. [S2] And another answers it."
GUIDANCE_SCALE = 3.0
DELAY_TAIL = 16  # generate's max_new_tokens = frames + max(delay pattern) + 1


def run(
    batch_sizes: tuple[int, ...] = (1, 4, 8),
    repeats: int = 3,
    progress: bool = False,
    shape: str = "dia-small",
    frames: int = 24,
) -> dict[str, Any]:
    torch.manual_seed(0)
    reference = reference_dia(shape)
    params = sum(p.numel() for p in reference.parameters())
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        _save(reference, Path(directory))
        for batch in batch_sizes:
            seconds = statistics.median(
                _time_transformers(reference, batch, frames) for _ in range(repeats)
            )
            results.append({"batch": batch, "transformers_frames_per_s": batch * frames / seconds})
        del reference
        config = EngineConfig(
            page_size=16,
            max_num_seqs=max(batch_sizes),
            max_num_batched_tokens=max(256, max(batch_sizes) * 2),
            enable_prefix_caching=False,
            kv_cache_memory_bytes=1 << 30,
        )
        engine = Engine.from_pretrained(
            directory, engine_config=config, cpu=CpuConfig(linear_dtype="float32")
        )
        period_s = 1.0 / engine.frame_rate
        _time_engine(engine, max(batch_sizes), frames)  # warm up: first steps allocate
        for entry in results:
            batch = entry["batch"]
            step_s = statistics.median(_time_engine(engine, batch, frames) for _ in range(repeats))
            entry["engine_decode_step_ms"] = 1000 * step_s
            entry["engine_frames_per_s"] = batch / step_s
            entry["engine_over_transformers"] = (
                entry["engine_frames_per_s"] / entry["transformers_frames_per_s"]
            )
            entry["engine_realtime"] = step_s <= period_s
            if progress:
                print(entry, flush=True)
    return {
        "benchmark": "dia",
        "shape": shape,
        "model": {**SHAPES[shape], "parameters": params, "dtype": "float32"},
        "guidance_scale": GUIDANCE_SCALE,
        "frames": frames,
        "threads": torch.get_num_threads(),
        "results": results,
    }


def reference_dia(shape: str) -> Any:
    """``transformers``' Dia in ``shape``: Dia's heads, ids and delay pattern, random weights."""
    from transformers import DiaConfig, DiaForConditionalGeneration, GenerationConfig

    sizes = SHAPES[shape]
    config = DiaConfig(encoder_config=sizes["encoder"], decoder_config=sizes["decoder"])
    model: Any = DiaForConditionalGeneration(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=1026,
        eos_token_id=1024,
        pad_token_id=1025,
        decoder_start_token_id=1026,
        guidance_scale=GUIDANCE_SCALE,
        top_k=50,
        temperature=1.8,
        top_p=0.9,
        do_sample=True,
    )
    return model.eval()


def _save(model: Any, directory: Path) -> None:
    """The checkpoint in the public layout, its codec a small random DAC beside it."""
    from transformers import DacConfig, DacModel

    model.save_pretrained(directory)
    codec = directory / "dac"
    small_dac = DacConfig(  # Dia's: 44.1 kHz, 512 samples a frame, 9 codebooks of 1,024
        encoder_hidden_size=8,
        decoder_hidden_size=64,
        codebook_dim=4,
        sampling_rate=44100,
        downsampling_ratios=[2, 4, 8, 8],
        n_codebooks=9,
        codebook_size=1024,
    )
    DacModel(small_dac).save_pretrained(codec)
    reference = {"audio_tokenizer_name_or_path": str(codec)}
    (directory / "audio_tokenizer_config.json").write_text(json.dumps(reference))


def _text_ids(batch: int) -> torch.Tensor:
    return torch.tensor([list(TEXT.encode())] * batch)


def _time_transformers(model: Any, batch: int, frames: int) -> float:
    ids = _text_ids(batch)
    start_rows = torch.full((batch, 1, model.config.decoder_config.num_channels), 1026)
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            decoder_input_ids=start_rows,
            decoder_attention_mask=torch.ones(batch, 1, dtype=torch.long),
            do_sample=False,
            guidance_scale=GUIDANCE_SCALE,
            max_new_tokens=frames + DELAY_TAIL,
        )
    return time.perf_counter() - started


def _time_engine(engine: Engine, batch: int, frames: int) -> float:
    """The median step with ``batch`` streams decoding and nothing else."""
    greedy = SamplingParams(temperature=0.0, top_k=50, guidance_scale=GUIDANCE_SCALE)
    duration = (frames + DELAY_TAIL) / engine.frame_rate
    for i in range(batch):
        request_id = f"bench-{i}-{time.monotonic_ns()}"
        engine.add_request(SynthesisRequest(request_id, TEXT, "default", duration, greedy))
    decode_steps = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        step = engine.telemetry.last_step
        if step is not None and step.tokens == step.decodes == batch:
            decode_steps.append(time.perf_counter() - started)
    return statistics.median(decode_steps)
