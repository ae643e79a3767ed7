"""Orpheus-shaped random weights served by the engine in process: time to first audio and
on-time delivery for N concurrent streams, with SNAC 24 kHz (random weights, noise on)
decoding every stream's audio, streamed and batched.

On a CUDA machine, the 3B shape (28 layers, 3072 wide, 24/8 heads, vocabulary 156,940)::

    python benchmarks/orpheus_streams.py --shape 3b --device cuda --dtype bfloat16 --json

``--shape small`` (4 layers, 512 wide) and ``--shape cpu`` (4 layers, 128 wide) run anywhere.
Streams arrive ``--gap-ms`` apart, each asks for ``--seconds`` of audio with the model's
sampling defaults. A stream's listener starts playing ``--reserve-ms`` after its first audio
(the engine's ``realtime.playout_reserve_ms``, 100); a chunk that arrives after its own
playback time is late (an underrun). Prints one JSON object per stream count.

``--peer`` also runs each level the way the Orpheus peer servers do, on the same weights: one
``transformers`` ``generate`` per request (its own thread and cache, sampling restricted to
each frame position's audio range as cadenza's), and every 7 tokens, once 28 are there, an
offline SNAC decode of the last 4 frames keeping the second (2048 samples).
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
from tests.unit.engine.orpheus_checkpoints import orpheus_config, save_tokenizer

SHAPES = {
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
           "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
    "cpu": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},
}  # fmt: skip


def build_checkpoint(directory: Path, shape: str, device: str, dtype: torch.dtype) -> None:
    from transformers import LlamaForCausalLM

    config = orpheus_config(max_positions=131072, rope_original=8192, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)  # type: ignore[arg-type]
    model.save_pretrained(directory)
    del model
    save_tokenizer(directory)


def run_level(
    engine: Engine, streams: int, seconds: float, gap_s: float, reserve_s: float
) -> dict[str, Any]:
    listener = _Listener(engine.sample_rate, reserve_s)
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
            listener.added[request_id] = time.perf_counter()
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[0][0] - time.perf_counter()) if arrivals else 0.0)
            continue
        outputs = engine.step()
        steps += 1
        now = time.perf_counter()
        for output in outputs:
            if len(output.audio):
                listener.heard_audio(output.request_id, len(output.audio), now)
    wall = time.perf_counter() - started
    return listener.summary(streams, wall) | {
        "steps": steps,
        "mean_step_ms": round(1000 * wall / max(steps, 1), 2),
    }


class _Listener:
    """When each stream's audio arrived, against when its listener plays it."""

    def __init__(self, sample_rate: int, reserve_s: float) -> None:
        self.sample_rate = sample_rate
        self.reserve_s = reserve_s
        self.added: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.heard: dict[str, float] = {}
        self.late: dict[str, int] = {}
        self.worst_late_ms = 0.0

    def heard_audio(self, request_id: str, samples: int, now: float) -> None:
        if request_id not in self.first:
            self.first[request_id] = now
            self.heard[request_id] = 0.0
        due = self.first[request_id] + self.reserve_s + self.heard[request_id]
        if now > due + 1e-3:
            self.late[request_id] = self.late.get(request_id, 0) + 1
            self.worst_late_ms = max(self.worst_late_ms, 1000 * (now - due))
        self.heard[request_id] += samples / self.sample_rate

    def summary(self, streams: int, wall: float) -> dict[str, Any]:
        ttfa = sorted(1000 * (self.first[r] - self.added[r]) for r in self.first)
        return {
            "streams": streams,
            "ttfa_ms_p50": round(statistics.median(ttfa), 1),
            "ttfa_ms_p95": round(ttfa[min(len(ttfa) - 1, int(0.95 * len(ttfa)))], 1),
            "streams_with_underruns": len(self.late),
            "late_chunks": sum(self.late.values()),
            "worst_late_ms": round(self.worst_late_ms, 1),
            "audio_s": round(sum(self.heard.values()), 1),
            "wall_s": round(wall, 2),
        }


def run_peer_level(
    directory: Path, engine: Engine, streams: int, seconds: float, gap_s: float, reserve_s: float
) -> dict[str, Any]:
    """The peer servers' way, on the same weights and codec (see the module docstring)."""
    import threading

    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.generation.streamers import BaseStreamer

    from cadenza.engine.models import orpheus
    from tests.unit.engine.orpheus_checkpoints import (
        AudioPositionMask,
        reference_frames,
        reference_prompt,
    )

    model = LlamaForCausalLM.from_pretrained(directory, dtype=engine.model.dtype).eval()  # type: ignore[no-untyped-call]
    model.to(engine.model.device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    codec = engine.intake.codec
    assert codec is not None
    decode = codec.decode
    hop = 2048
    listener = _Listener(engine.sample_rate, reserve_s)
    sampling = engine.model.default_sampling
    new_tokens = round(seconds * codec.frame_rate) * orpheus.CODES_PER_FRAME

    class WindowDecoder(BaseStreamer):
        def __init__(self, request_id: str, prompt_length: int) -> None:
            self.request_id = request_id
            self.skip = prompt_length
            self.tokens: list[int] = []

        def put(self, value: torch.Tensor) -> None:
            ids = value.reshape(-1).tolist()
            if self.skip:  # generate() hands the prompt over first
                self.skip = 0
                return
            self.tokens += ids
            count = len(self.tokens)
            if count >= 28 and count % 7 == 0:
                codes = reference_frames(self.tokens[-28:]).to(engine.model.device)
                audio = decode(codes)[0, hop : 2 * hop]
                listener.heard_audio(self.request_id, audio.numel(), time.perf_counter())

        def end(self) -> None:
            pass

    def serve(request_id: str) -> None:
        text = f"Stream {request_id} is reading a sentence of moderate length aloud."
        prompt = reference_prompt(tokenizer, "tara", text)
        listener.added[request_id] = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                torch.tensor([prompt], device=engine.model.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                repetition_penalty=sampling.repetition_penalty,
                logits_processor=[AudioPositionMask(len(prompt))],
                streamer=WindowDecoder(request_id, len(prompt)),
                pad_token_id=0,
            )

    started = time.perf_counter()
    threads = []
    for index in range(streams):
        time.sleep(max(0.0, started + index * gap_s - time.perf_counter()))
        thread = threading.Thread(target=serve, args=(f"p{index}",))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return listener.summary(streams, time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--streams", default="1,4")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--kv-gib", type=float, default=2.0)
    parser.add_argument("--reserve-ms", type=float, default=100.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--peer", action="store_true", help="also run the peers' pipeline")
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
                    "chunk_frames": [engine.frames.first_chunk_frames, engine.frames.chunk_frames],
                }
            ),
            flush=True,
        )
        reserve_s = args.reserve_ms / 1000
        run_level(engine, 1, 1.0, 0.0, reserve_s)  # warm-up: kernels compiled, allocator primed
        for count in counts:
            result = {"pipeline": "cadenza"}
            result |= run_level(engine, count, args.seconds, args.gap_ms / 1000, reserve_s)
            print(json.dumps(result) if args.json else result, flush=True)
            engine.check_integrity()
            if args.peer:
                peer = {"pipeline": "peer"}
                peer |= run_peer_level(
                    directory, engine, count, args.seconds, args.gap_ms / 1000, reserve_s
                )
                print(json.dumps(peer) if args.json else peer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
