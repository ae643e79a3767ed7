"""``cadenza bench csm``: a CSM-shaped two-level model served by the engine against
``transformers``' ``CsmForConditionalGeneration.generate`` per request, and Mimi's streaming
decoder against its offline decode, same weights, one run.

Model: random weights in CSM's shape (32 codebooks of 2,051 ids, a depth decoder of 4 layers
emitting 31 codebooks per frame); ``shape="csm-1b"`` is the public model's size (backbone
Llama-3.2-1B, depth decoder hidden 1024), ``"csm-small"`` a backbone of 8 layers at hidden 1024
and a depth decoder at hidden 256. Weights fp32; the engine runs twice, with its CPU linears
multiplying in fp32 and with its default (``cpu.linear_dtype = auto``: bf16 on a CPU with bf16
matrix units).

Measured per batch size: the engine's decode step (one frame for every stream: backbone step,
sampling, 31 depth steps with sampling between them), the depth loop alone, and whether the
step fits in the frame period (80 ms at 12.5 frames/s: every stream of the batch keeps up);
``transformers`` generates one request's frames (greedy) and reports its frames per second.
Mimi (the real model's shape, random weights): ``streams`` streams decoded frame by frame, all
in one call per frame, against each stream's whole code sequence decoded offline.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models

from cadenza.codecs.mimi import MimiCodec, build_random_mimi
from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.layouts.frame_rows import text_row

SHAPES: dict[str, dict[str, Any]] = {
    "csm-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "depth": {
            "hidden_size": 1024,
            "intermediate_size": 8192,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 128,
        },
    },
    "csm-small": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "depth": {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 32,
        },
    },
}
FRAME_PERIOD_S = 1 / 12.5
PROMPT_ROWS = 24
MIMI_FRAMES = 50  # 4 s per stream


def run(
    batch_sizes: tuple[int, ...] = (1, 4, 8),
    repeats: int = 3,
    progress: bool = False,
    shape: str = "csm-small",
    frames: int = 8,
) -> dict[str, Any]:
    torch.manual_seed(0)
    reference = reference_csm(shape)
    params = sum(p.numel() for n, p in reference.named_parameters() if "codec_model" not in n)
    transformers_s = statistics.median(
        _time_transformers(reference, frames) for _ in range(max(1, repeats // 2))
    )
    results: list[dict[str, Any]] = [{"batch": batch} for batch in batch_sizes]
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        del reference  # one model in memory at a time (csm-1b is 6 GB in fp32)
        _save_word_tokenizer(Path(directory))
        config = EngineConfig(
            page_size=16,
            max_num_seqs=max(batch_sizes),
            max_num_batched_tokens=max(256, max(batch_sizes) * PROMPT_ROWS),
            enable_prefix_caching=False,
            kv_cache_memory_bytes=256 << 20,
        )
        for linear in ("float32", "auto"):
            engine = Engine.from_pretrained(
                directory, engine_config=config, cpu=CpuConfig(linear_dtype=linear)
            )
            for entry in results:
                batch = entry["batch"]
                runs = [_time_engine(engine, batch, frames) for _ in range(repeats)]
                step_s = statistics.median(runs)
                depth_s = statistics.median(
                    _time_depth(engine, batch, SHAPES[shape]["hidden_size"]) for _ in range(repeats)
                )
                entry[f"{linear}_decode_step_ms"] = 1000 * step_s
                entry[f"{linear}_depth_loop_ms"] = 1000 * depth_s
                entry[f"{linear}_frames_per_s"] = batch / step_s
                entry[f"{linear}_realtime"] = step_s <= FRAME_PERIOD_S
                if progress:
                    print(linear, entry, flush=True)
            del engine
    fitting = [r["batch"] for r in results if r["auto_realtime"]]
    return {
        "benchmark": "csm",
        "shape": shape,
        "model": {**SHAPES[shape], "parameters": params, "dtype": "float32"},
        "threads": torch.get_num_threads(),
        "transformers_frames_per_s_one_request": frames / transformers_s,
        "transformers_realtime_factor": (frames / transformers_s) * FRAME_PERIOD_S,
        "results": results,
        "largest_realtime_batch_measured": max(fitting, default=0),
        "mimi": mimi_streaming(batch_sizes, repeats),
    }


def reference_csm(shape: str) -> Any:
    """``transformers``' CSM in ``shape`` (its Mimi tiny: generate does not decode audio)."""
    from transformers import CsmConfig, CsmForConditionalGeneration, MimiConfig

    sizes = dict(SHAPES[shape])
    depth = {**sizes.pop("depth"), "backbone_hidden_size": sizes["hidden_size"]}
    codec = MimiConfig(
        hidden_size=64,
        num_filters=4,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        upsample_groups=64,
    )
    codec_config: dict[str, Any] = codec.to_dict()  # type: ignore[no-untyped-call]
    config = CsmConfig(**sizes, depth_decoder_config=depth, codec_config=codec_config)
    model: Any = CsmForConditionalGeneration(config)
    return model.eval()


def _save_word_tokenizer(directory: Path) -> None:
    """A tokenizer file for the loader (the benchmark gives prompts as ids)."""
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(
        str(directory / "tokenizer.json")
    )


def _prompt(index: int) -> list[int]:
    return [128000, *range(1000 + index, 1000 + index + PROMPT_ROWS - 2), 128001]


def _time_transformers(model: Any, frames: int) -> float:
    ids = torch.tensor([_prompt(0)])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=frames,
            do_sample=False,
            depth_decoder_do_sample=False,
        )
    elapsed = time.perf_counter() - started
    assert out.shape[1] <= frames
    return elapsed * frames / max(1, out.shape[1])


def _time_engine(engine: Engine, batch: int, frames: int) -> float:
    """The median decode-only step with ``batch`` streams decoding."""
    greedy = SamplingParams(temperature=0.0, top_k=0)
    width = engine.model.layout.num_codebooks
    for i in range(batch):
        rows = [text_row(token, width) for token in _prompt(i)]
        engine.add_tokens(f"bench-{i}-{time.monotonic_ns()}", rows, frames, greedy)
    decode_steps = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        step = engine.telemetry.last_step
        if step is not None and step.tokens == step.decodes == batch:
            decode_steps.append(time.perf_counter() - started)
    return statistics.median(decode_steps)


@torch.inference_mode()
def _time_depth(engine: Engine, batch: int, backbone_hidden_size: int) -> float:
    """One frame's depth loop (31 levels) for ``batch`` streams, argmax between levels, from
    random backbone hidden states of ``backbone_hidden_size``."""
    depth = engine.model.depth
    assert depth is not None, "a CSM-shaped model decodes each frame's codebooks in depth"
    hidden = torch.randn(batch, backbone_hidden_size)
    ids = torch.zeros(batch, dtype=torch.long)
    started = time.perf_counter()
    loop = depth.begin(hidden, ids)
    logits = loop.logits
    for _ in range(1, depth.num_levels):
        logits = loop.advance(logits.argmax(dim=-1))
    return time.perf_counter() - started


def mimi_streaming(stream_counts: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """Mimi's streaming decoder (frame by frame, every stream in one call) against its offline
    decode of each stream's whole codes, in audio seconds per wall second."""
    from transformers import MimiConfig

    codec = MimiCodec(build_random_mimi(MimiConfig(), seed=0), num_codebooks=32)
    decoder = codec.streaming_decoder(max(stream_counts))
    results = []
    for count in stream_counts:
        codes = torch.randint(0, codec.codebook_size, (count, 32, MIMI_FRAMES))
        audio_s = count * MIMI_FRAMES / codec.frame_rate
        offline, streaming = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            for stream in range(count):
                codec.decode(codes[stream : stream + 1])
            offline.append(time.perf_counter() - started)
            slots = [decoder.open() for _ in range(count)]
            started = time.perf_counter()
            for frame in range(MIMI_FRAMES):
                final = frozenset(slots) if frame == MIMI_FRAMES - 1 else frozenset()
                decoder.decode(
                    {slot: codes[i, :, frame : frame + 1] for i, slot in enumerate(slots)}, final
                )
            streaming.append(time.perf_counter() - started)
        results.append(
            {
                "streams": count,
                "offline_audio_s_per_s": audio_s / statistics.median(offline),
                "streaming_audio_s_per_s": audio_s / statistics.median(streaming),
                "streaming_ms_per_frame_call": 1000 * statistics.median(streaming) / MIMI_FRAMES,
            }
        )
    return results
