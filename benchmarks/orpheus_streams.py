"""Orpheus-shaped random weights served by the engine in process: time to first audio and
on-time delivery for N concurrent streams, with SNAC 24 kHz (random weights, noise on)
decoding every stream's audio, streamed and batched.

On a CUDA machine, the 3B shape (28 layers, 3072 wide, 24/8 heads, vocabulary 156,940)::

    python benchmarks/orpheus_streams.py --shape 3b --device cuda --dtype bfloat16 --json

``--shape small`` (4 layers, 512 wide) runs anywhere, as a smoke test. Streams arrive
``--gap-ms`` apart, each asks for ``--seconds`` of audio with the model's sampling defaults.
A stream's listener starts playing at its first audio; a chunk that arrives after its own
playback time is late (an underrun). Prints one JSON object per stream count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadenza.config import EngineConfig, LimitsConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.engine.engine import Engine
from tests.unit.engine.orpheus_checkpoints import save_tokenizer

SHAPES = {
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
           "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},
}  # fmt: skip


def build_checkpoint(directory: Path, shape: str, device: str, dtype: torch.dtype) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=156_940,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128009,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    del model
    save_tokenizer(directory)


def run_level(engine: Engine, streams: int, seconds: float, gap_s: float) -> dict[str, Any]:
    rate = engine.sample_rate
    added: dict[str, float] = {}
    first: dict[str, float] = {}
    heard: dict[str, float] = {}  # audio seconds delivered so far
    late: dict[str, int] = {}
    worst_late_ms = 0.0
    steps = 0
    started = time.perf_counter()
    arrivals = [(started + i * gap_s, f"s{i}") for i in range(streams)]
    while arrivals or engine.has_unfinished_requests():
        now = time.perf_counter()
        while arrivals and arrivals[0][0] <= now:
            _, request_id = arrivals.pop(0)
            text = f"Stream {request_id} is reading a sentence of moderate length aloud."
            engine.add_request(
                SynthesisRequest(request_id, text, "tara", seconds, engine.model.default_sampling)
            )
            added[request_id] = time.perf_counter()
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[0][0] - time.perf_counter()) if arrivals else 0.0)
            continue
        outputs = engine.step()
        steps += 1
        now = time.perf_counter()
        for output in outputs:
            if not len(output.audio):
                continue
            request_id = output.request_id
            if request_id not in first:
                first[request_id] = now
                heard[request_id] = 0.0
            due = first[request_id] + heard[request_id]
            if now > due + 1e-3:
                late[request_id] = late.get(request_id, 0) + 1
                worst_late_ms = max(worst_late_ms, 1000 * (now - due))
            heard[request_id] += len(output.audio) / rate
    wall = time.perf_counter() - started
    ttfa = sorted(1000 * (first[r] - added[r]) for r in first)
    return {
        "streams": streams,
        "ttfa_ms_p50": round(statistics.median(ttfa), 1),
        "ttfa_ms_p95": round(ttfa[min(len(ttfa) - 1, int(0.95 * len(ttfa)))], 1),
        "ttfa_ms_max": round(ttfa[-1], 1),
        "streams_with_underruns": len(late),
        "late_chunks": sum(late.values()),
        "worst_late_ms": round(worst_late_ms, 1),
        "audio_s": round(sum(heard.values()), 1),
        "wall_s": round(wall, 2),
        "steps": steps,
        "mean_step_ms": round(1000 * wall / max(steps, 1), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--streams", default="1,4")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--kv-gib", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="orpheus-") as tmp:
        directory = Path(tmp)
        began = time.perf_counter()
        build_checkpoint(directory, args.shape, args.device, dtype)
        built = time.perf_counter()
        engine = Engine.from_pretrained(
            str(directory),
            device=args.device,
            dtype=args.dtype,
            codec="snac_24khz",
            engine_config=EngineConfig(
                kv_cache_memory_bytes=int(args.kv_gib * 2**30),
                max_num_seqs=max(counts),
                max_num_batched_tokens=max(512, max(counts)),
            ),
            limits=LimitsConfig(),
        )
        loaded = time.perf_counter()
        print(
            json.dumps(
                {
                    "shape": args.shape,
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "dtype": args.dtype,
                    "build_s": round(built - began, 1),
                    "load_s": round(loaded - built, 1),
                    "chunk_frames": [engine.config.first_chunk_frames, engine.config.chunk_frames],
                }
            ),
            flush=True,
        )
        run_level(engine, 1, 1.0, 0.0)  # warm-up: kernels compiled, allocator primed
        for count in counts:
            result = run_level(engine, count, args.seconds, args.gap_ms / 1000)
            print(json.dumps(result) if args.json else result, flush=True)
            engine.check_integrity()
    return 0


if __name__ == "__main__":
    sys.exit(main())
