"""The GPU check: what decides Orpheus streams per GPU, measured offline in minutes.

On a CUDA machine with a CUDA PyTorch (2.11 or newer) and Triton, from the source tree, nothing
installed::

    make gpu-wheels                    # here, with network: .gpu-wheels/ (under 64 MiB)
    python benchmarks/gpu_check.py     # there: the wheels unpacked to a temporary directory

The wheels are what the check imports beyond PyTorch and Triton (:data:`WHEELS`, at the versions
installed where ``make gpu-wheels`` runs); a package the GPU machine already has is taken from
there first.

``--cpu`` runs the same on the CPU at tiny shapes (``make test`` runs it; Triton's kernels in
its interpreter). Prints one JSON object:

* ``device``; ``shape``: the Orpheus shape measured (the 3B's on CUDA: 28 layers, 3072 wide,
  24/8 heads of 128, vocabulary 156,940, random weights; a 2-layer one on the CPU).
* ``fullgraph_compiled``: whether the fixed-shape decode step (:mod:`cadenza.engine.static_decode`,
  at a bucket of the running streams) traces as one graph (``torch.compile(fullgraph=True)``,
  the trace alone), and ``fullgraph_break``, the first break when it does not (a host read, a
  shape that depends on values); ``graph_ops``, the operators of the traced graph.
* ``graphs``: whether the engine captured its decode steps as CUDA graphs, at which batch
  sizes, and the memory they took; ``kv_pages`` and ``max_num_seqs`` as the engine sized them
  (on CUDA from its defaults: 90 % of free memory after the weights, less the graphs);
  ``overlaps_steps``: whether a step's forward is launched before the last one's audio.
* ``host_reads_per_step`` and ``launches_per_step``: over the engine's decode steps at the
  largest bucket (:mod:`cadenza.engine.device_audit`: the same counting on every device), and
  ``host_reads_by_call``; ``launches_outside_forward``: those not in the fixed-shape forward
  (what a step launches besides its one graph replay on CUDA: heads, sampler, bookkeeping);
  ``blocking_uploads_per_step``: tensors made from host values straight on the device, each a
  wait on a GPU as a read is.
* ``triton_ok``: every Triton kernel equal to its torch reference (``benchmarks/gpu_kernels.py``'s
  checks).
* ``buckets``: ``{"batch", "step_ms", "eager_ms", "graphed_ms"}`` at each batch size, medians:
  the engine's whole decode step as it serves (sampling and audio included), the decode
  forward at the bucket's fixed shapes run eagerly, and replayed as a graph (``null`` off CUDA).
* ``decode_attention`` (CUDA): the paged decode kernel's bandwidth at the 3B's heads, contexts
  256-2,048 and batches 1-128.
* ``snac``: the streaming SNAC decoder's milliseconds a stream-frame at 1 and 8 streams.
* ``realtime_streams``: the most streams, of those tried, that the engine keeps in real time in
  process (no chunk late for a listener that starts 100 ms after its first audio).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".gpu-wheels"
# What the check imports beyond PyTorch and Triton: cadenza's engine and its configuration, and
# the transformers model it builds the random checkpoint with. Their own requirements follow.
WHEELS = ("transformers", "tokenizers", "safetensors", "numpy", "pydantic", "pydantic-settings")
# What a CUDA PyTorch and Triton bring with them.
BROUGHT = frozenset({"torch", "triton", "setuptools"})

CPU_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU at tiny shapes")
    parser.add_argument(
        "--layers",
        type=int,
        default=2,
        help="--cpu: the tiny shape's layers (28: the 3B's count, its launches and host time "
        "per step at widths that cost nothing)",
    )
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    parser.add_argument(
        "--requirements",
        action="store_true",
        help="print the wheels the check needs, pinned to the versions installed here, and "
        "exit (make gpu-wheels downloads them)",
    )
    args = parser.parse_args()
    if args.layers < 1:
        parser.error("--layers must be positive")
    if args.requirements:
        print(" ".join(_pinned_wheels()))
        return 0
    scratch_site = tempfile.TemporaryDirectory(prefix="gpu-check-site-")
    _use_wheels(WHEEL_DIR, Path(scratch_site.name))
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device; --cpu runs the check on the CPU"}))
        return 2
    report: dict[str, Any] = {"device": _device_name(device)}
    report["triton_ok"] = _triton_ok(device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        engine, shape = _orpheus_engine(Path(scratch), device, args.layers)
        report["shape"] = shape
        report.update(_graphs(engine))
        report.update(_fullgraph(engine))
        most = engine.scheduler.max_num_seqs
        buckets = (1, 2, 4) if device == "cpu" else (1, 8, 32, 64, 128, 256)
        report["buckets"] = [_bucket(engine, b) for b in buckets if b <= most]
        report.update(_audit(engine, min(buckets[-1], most)))
        counts = (1, 2) if device == "cpu" else (16, 32, 64, 128, 192, 256)
        report["realtime_streams"] = _realtime_streams(
            engine, tuple(c for c in counts if c <= most)
        )
        engine.check_integrity()
    if device == "cuda":
        report["decode_attention"] = _decode_attention()
    report["snac"] = _snac(device)
    print(json.dumps(report, indent=1))
    return 0 if report["triton_ok"] else 1


def _pinned_wheels() -> list[str]:
    """:data:`WHEELS` and everything they require (extras aside), as installed here, each
    ``name==version``, less :data:`BROUGHT`."""
    from packaging.requirements import Requirement

    pinned: dict[str, str] = {}
    pending = list(WHEELS)
    while pending:
        name = pending.pop()
        key = name.lower().replace("_", "-")
        if key in pinned or key in BROUGHT:
            continue
        try:
            pinned[key] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        for line in metadata.requires(name) or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return [f"{name}=={version}" for name, version in sorted(pinned.items())]


def _use_wheels(wheels: Path, site: Path) -> int:
    """Unpack every wheel in ``wheels`` into ``site`` and put it at the end of ``sys.path``
    (what this Python has comes first); returns how many."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    for wheel in found:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    if found:
        sys.path.append(str(site))
    return len(found)


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({torch.get_num_threads()} threads)"


def _triton_ok(device: str) -> bool:
    import torch
    from gpu_kernels import _checks

    return all(check["ok"] for check in _checks(torch.device(device)))


def _orpheus_engine(directory: Path, device: str, layers: int) -> tuple[Any, dict[str, Any]]:
    """An engine over a random Orpheus checkpoint (the 3B shape on CUDA, in bf16; a tiny one of
    ``layers`` layers on the CPU), its SNAC codec with random weights; the torch step (what a
    GPU runs)."""
    import torch
    from orpheus_streams import SHAPES, build_checkpoint

    from cadenza.config import CpuConfig, EngineConfig, LimitsConfig
    from cadenza.engine.builder import build_engine, pretrained_config

    if device == "cpu":
        SHAPES["gpu-check-cpu"] = {**CPU_SHAPE, "num_hidden_layers": layers}
    shape = "gpu-check-cpu" if device == "cpu" else "3b"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    build_checkpoint(directory, shape, device, dtype)
    # CUDA: the engine's own defaults (the KV a share of free memory, max_num_seqs following
    # it, decode graphs); the CPU runs the same fixed-shape steps eagerly, in a small cache.
    engine_config = EngineConfig(max_num_batched_tokens=4096)
    if device == "cpu":
        # 8,192 positions at any layer count (the torch path reads every page-table column of
        # a fixed-shape step: few pages)
        engine_config = EngineConfig(kv_cache_memory_bytes=layers * (4 << 20), max_num_seqs=8)
    config = pretrained_config(
        str(directory),
        device=device,
        dtype="float32" if device == "cpu" else "bfloat16",
        codec="snac_24khz",
        cpu=CpuConfig(fused_decode=False, pack_weights=False),
        engine_config=engine_config,
        limits=LimitsConfig(),
    )
    engine = build_engine(config, fixed_decode_shapes=True)
    return engine, {"family": "orpheus", **SHAPES[shape]}


def _requests(engine: Any, count: int, seconds: float, tag: str) -> list[str]:
    from cadenza.contract.request import SynthesisRequest

    ids = [f"{tag}-{index}" for index in range(count)]
    for request_id in ids:
        engine.add_request(
            SynthesisRequest(
                request_id,
                f"Stream {request_id} reads a sentence aloud.",
                "tara",
                seconds,
                engine.model.default_sampling,
            )
        )
    return ids


def _until_decoding(engine: Any, ids: list[str]) -> None:
    while any((seq := engine.sequence(i)) is not None and seq.is_prefilling for i in ids):
        engine.step()


def _finish(engine: Any, ids: list[str]) -> None:
    for request_id in ids:
        engine.abort_request(request_id)
    engine.step()
    engine.take_report()


def _graphs(engine: Any) -> dict[str, Any]:
    static = engine.runner.static_decode
    return {
        "graphs": {
            "captured": static is not None and static.graphed,
            "sizes": [] if static is None else list(static.sizes),
            "memory_mb": round(engine.runner.graph_memory_bytes / 1e6, 1),
        },
        "kv_pages": engine.kv.pool.num_pages,
        "max_num_seqs": engine.scheduler.max_num_seqs,
        "overlaps_steps": engine.overlaps_steps,
    }


def _fullgraph(engine: Any) -> dict[str, Any]:
    """Whether the fixed-shape decode step traces as one graph, at the bucket of two running
    streams: ``torch.compile(fullgraph=True, backend=...)`` with a backend that runs the traced
    graph as it is (the trace, not compiled kernels)."""
    import torch

    static = engine.runner.static_decode
    if static is None:
        return {"fullgraph_compiled": False, "fullgraph_break": "no fixed-shape decode step"}
    graphs: list[int] = []

    def keep(graph: Any, _: Any) -> Any:
        graphs.append(sum(node.op == "call_function" for node in graph.graph.nodes))
        return graph.forward

    ids = _requests(engine, 2, 2.0, "trace")
    _until_decoding(engine, ids)
    try:
        _decoding(engine, ids)  # their next slots, as a step gives them
        torch._dynamo.reset()
        with torch.inference_mode():
            torch.compile(static.forward_at, fullgraph=True, backend=keep)(2)  # type: ignore[no-untyped-call]
    except Exception as error:  # a graph break is the answer, not a failure of the check
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        return {"fullgraph_compiled": False, "fullgraph_break": first[:300]}
    finally:
        torch._dynamo.reset()
        _finish(engine, ids)
    return {"fullgraph_compiled": len(graphs) == 1, "fullgraph_break": None, "graph_ops": graphs}


def _decoding(engine: Any, ids: list[str]) -> list[Any]:
    """The sequences of ``ids``, each with a cache slot for its next token."""
    seqs = [engine.sequence(request_id) for request_id in ids]
    for seq in seqs:
        if not engine.kv.allocate_slots(seq, 1):
            raise RuntimeError("the KV cache is full")
    return seqs


def _bucket(engine: Any, batch: int, steps: int = 8) -> dict[str, Any]:
    """Medians at ``batch`` streams that all decode: the engine's whole step, and the decode
    forward at the bucket's fixed shapes, eager and replayed as a graph (where captured)."""
    import torch

    ids = _requests(engine, batch, _stream_s(engine), f"bucket{batch}")
    _until_decoding(engine, ids)
    step_ms = _median_ms(engine, engine.step, steps)
    static = engine.runner.static_decode
    seqs = _decoding(engine, ids)
    eager_ms = graphed_ms = None
    with torch.inference_mode():
        if static is not None:
            eager_ms = _median_ms(engine, partial(static.eager, seqs), steps)
            if static.graphed:
                graphed_ms = _median_ms(engine, partial(static.run, seqs), steps)
    _finish(engine, ids)
    return {"batch": batch, "step_ms": step_ms, "eager_ms": eager_ms, "graphed_ms": graphed_ms}


def _stream_s(engine: Any) -> float:
    """Seconds of audio a measured stream asks for: 30 (about 2,500 positions) on CUDA, 8 in
    the CPU's small cache."""
    return 30.0 if engine.model.device.type == "cuda" else 8.0


def _median_ms(engine: Any, call: Any, times: int) -> float:
    """The median of ``times`` calls of ``call``, each waited for on the device."""
    spans = []
    for _ in range(times):
        began = time.perf_counter()
        call()
        _synchronize(engine)
        spans.append(1000 * (time.perf_counter() - began))
    return round(statistics.median(spans), 3)


def _audit(engine: Any, batch: int, steps: int = 8) -> dict[str, Any]:
    import torch

    from cadenza.engine.device_audit import DeviceAudit

    ids = _requests(engine, batch, _stream_s(engine), "audit")
    _until_decoding(engine, ids)
    with DeviceAudit(engine.model.device) as audit:
        for _ in range(steps):
            engine.step()
    # The fixed-shape forward alone, counted eagerly: what one graph replay launches on CUDA.
    forward = DeviceAudit(engine.model.device)
    static = engine.runner.static_decode
    _synchronize(engine)
    if static is not None:
        seqs = _decoding(engine, ids)
        with forward, torch.inference_mode():
            static.eager(seqs)
    _finish(engine, ids)
    launches = audit.launch_count / steps
    return {
        "host_reads_per_step": round(audit.host_reads / steps, 1),
        "launches_per_step": round(launches, 1),
        "launches_outside_forward": round(launches - forward.launch_count, 1),
        "host_reads_by_call": {name: n / steps for name, n in audit.reads.most_common()},
        "blocking_uploads_per_step": round(audit.blocking_uploads / steps, 1),
    }


def _realtime_streams(engine: Any, counts: tuple[int, ...]) -> int:
    """The most streams of ``counts`` that ran with no chunk late (2 s of audio each, arriving
    50 ms apart; ``benchmarks/orpheus_streams.py``'s listener)."""
    from orpheus_streams import run_level

    held = 0
    run_level(engine, 1, 0.5, 0.0, 0.1)  # warm-up
    for count in counts:
        result = run_level(engine, count, 2.0, 0.05, 0.1)
        if result["streams_with_underruns"] == 0:
            held = count
    return held


def _synchronize(engine: Any) -> None:
    import torch

    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()


def _decode_attention() -> list[dict[str, Any]]:
    """The paged decode kernel at the 3B's heads (24 query, 8 KV, width 128, fp16 pages of 16):
    achieved bandwidth over the keys and values it reads."""
    import torch
    from gpu_kernels import _peak_bandwidth, _time_ms

    from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

    peak, _ = _peak_bandwidth()
    results = []
    for context in (256, 1024, 2048):
        for batch in (1, 16, 64, 128):
            blocks = context // 16
            shape = (batch * blocks, 16, 8, 128)
            k = torch.randn(shape, device="cuda", dtype=torch.float16)
            v = torch.randn(shape, device="cuda", dtype=torch.float16)
            tables = torch.randperm(batch * blocks, device="cuda").int().view(batch, blocks)
            lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
            q = torch.randn(batch, 24, 128, device="cuda", dtype=torch.float16)
            ms = _time_ms(partial(triton_paged_decode_attention, q, k, v, tables, lens, 128**-0.5))
            moved = 2 * k.numel() * k.element_size()
            results.append(
                {
                    "context": context,
                    "batch": batch,
                    "ms": round(ms, 4),
                    "gb_per_s": round(moved / ms / 1e6, 1),
                    "fraction_of_peak": round(moved / (ms / 1000) / peak, 3),
                }
            )
    return results


def _snac(device: str) -> list[dict[str, Any]]:
    """The streaming SNAC decoder (random weights): milliseconds a stream-frame, 16 frames a
    stream in chunks of 2."""
    import torch

    from cadenza.codecs.snac import load_snac

    codec = load_snac(noise=False, device=device)
    results = []
    for streams in (1, 8):
        decoder = codec.streaming_decoder(streams)
        codes = torch.randint(0, codec.codebook_size, (streams, codec.num_codebooks, 16))
        codes = codes.to(device)
        slots = [decoder.open() for _ in range(streams)]
        began = time.perf_counter()
        for start in range(0, 16, 2):
            final = frozenset(slots) if start + 2 >= 16 else frozenset()
            decoder.decode({s: codes[i, :, start : start + 2] for i, s in enumerate(slots)}, final)
        if device == "cuda":
            torch.cuda.synchronize()
        ms = 1000 * (time.perf_counter() - began) / (streams * 16)
        results.append({"streams": streams, "ms_per_stream_frame": round(ms, 3)})
    return results


if __name__ == "__main__":
    sys.exit(main())
