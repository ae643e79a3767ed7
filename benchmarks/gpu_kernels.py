"""Compile every Triton kernel, check it against the torch reference, and measure it.

On a CUDA machine, with cadenza importable (its checks also run in ``make gpu-check``,
``benchmarks/gpu_check.py``)::

    PYTHONPATH=. python benchmarks/gpu_kernels.py --json

checks paged decode attention (fp16, bf16, int8 pages) and the W8A16 linear against torch on
the GPU, then measures paged decode attention at batch 64 x 4,096 positions (32 query / 8 KV
heads of width 128, 16-token pages) as achieved bandwidth against the device's peak, and
W8A16 against torch's fp16 matmul for decode-sized row counts.

Without a GPU, ``--interpret`` runs the correctness half in Triton's interpreter on the CPU
(small shapes, fp16/fp32); CI runs it. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any

# Known HBM bandwidths (bytes/s) by device name fragment, for the percentage of peak.
PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 SXM": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "A10": 0.6e12,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interpret", action="store_true", help="CPU interpreter, small shapes")
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    device = torch.device("cpu" if args.interpret else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device; use --interpret for the CPU half"}))
        return 2
    report: dict[str, Any] = {"device": _device_name(device), "checks": _checks(device)}
    if device.type == "cuda":
        report["decode_bandwidth"] = [_decode_bandwidth(kv) for kv in ("fp16", "int8")]
        report["w8a16_vs_fp16"] = _w8a16_speed()
    print(json.dumps(report, indent=1))
    return 0 if all(check["ok"] for check in report["checks"]) else 1


def _device_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"


def _checks(device: Any) -> list[dict[str, Any]]:
    import torch

    from cadenza.kernels import torch_attention
    from cadenza.kernels.int8_linear import quantize_weight
    from cadenza.kernels.kv_quant import dequantize, quantize_per_token
    from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention
    from cadenza.kernels.triton_int8_linear import triton_w8a16_matmul

    interpret = device.type == "cpu"
    dtypes = [torch.float32, torch.float16] if interpret else [torch.float16, torch.bfloat16]
    shapes = (
        [(3, 4, 2, 64, 16, [1, 17, 70])]
        if interpret
        else [
            (8, 32, 8, 128, 16, [1, 16, 300, 4096, 777, 64, 2, 1025]),
            (4, 8, 8, 64, 32, [33, 1, 2048, 100]),
        ]
    )
    results = []
    generator = torch.Generator(device=device).manual_seed(0)
    for batch, hq, hkv, dim, block, lengths in shapes:
        blocks = [math.ceil(n / block) for n in lengths]
        num_pages = sum(blocks) + 4
        tables = torch.full((batch, max(blocks) + 1), -1, dtype=torch.int32, device=device)
        order = torch.randperm(num_pages, device=device, generator=generator)
        start = 0
        for row, needed in enumerate(blocks):
            tables[row, :needed] = order[start : start + needed].int()
            start += needed
        seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        for dtype in dtypes:
            for int8 in (False, True):
                shape = (num_pages, block, hkv, dim)
                k = torch.randn(shape, device=device, generator=generator).to(dtype)
                v = torch.randn(shape, device=device, generator=generator).to(dtype)
                ks = vs = None
                if int8:
                    k, ks = quantize_per_token(k)
                    v, vs = quantize_per_token(v)
                q = torch.randn(batch, hq, dim, device=device, generator=generator).to(dtype)
                out = triton_paged_decode_attention(q, k, v, tables, seq_lens, dim**-0.5, ks, vs)
                kf = dequantize(k, ks, torch.float32) if ks is not None else k.float()
                vf = dequantize(v, vs, torch.float32) if vs is not None else v.float()
                expected = torch_attention.torch_paged_decode_attention(
                    q.float(), kf, vf, tables, seq_lens, dim**-0.5
                )
                error = float((out.float() - expected).abs().max())
                tolerance = 1e-4 if dtype == torch.float32 else 2e-2
                results.append(
                    {
                        "kernel": "paged_decode_attention",
                        "dtype": str(dtype).removeprefix("torch."),
                        "kv": "int8" if int8 else "same",
                        "shape": [batch, hq, hkv, dim, block],
                        "max_abs_error": error,
                        "ok": error <= tolerance,
                    }
                )
    for m, n, k_dim in (
        ([1, 64, 96], [33, 100, 200])
        if interpret
        else (
            [1, 4096, 4096],
            [64, 14336, 4096],
        )
    ):
        dtype = torch.float32 if interpret else torch.float16
        q_w, scale = quantize_weight(torch.randn(n, k_dim, device=device, generator=generator))
        x = torch.randn(m, k_dim, device=device, generator=generator).to(dtype)
        out = triton_w8a16_matmul(x, q_w, scale)
        expected = x.float() @ (q_w.float() * scale[:, None]).T
        error = float(((out.float() - expected).abs() / (expected.abs() + 1)).max())
        results.append(
            {"kernel": "w8a16", "shape": [m, n, k_dim], "max_rel_error": error, "ok": error < 2e-2}
        )
    return results


def _time_ms(fn: Any, repeats: int = 50) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _peak_bandwidth() -> tuple[float, str]:
    import torch

    name = torch.cuda.get_device_name()
    for fragment, value in PEAK_BANDWIDTH.items():
        if fragment in name:
            return value, f"datasheet ({fragment})"
    # Unknown device: the best of a large device-to-device copy stands in for the peak.
    data = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_ms = _time_ms(lambda: data.clone(), repeats=10)
    return 2 * data.numel() / (copy_ms / 1000), "measured copy"


def _decode_bandwidth(kv: str) -> dict[str, Any]:
    import torch

    from cadenza.kernels.kv_quant import quantize_per_token
    from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

    batch, hq, hkv, dim, block, context = 64, 32, 8, 128, 16, 4096
    blocks_per_seq = context // block
    num_pages = batch * blocks_per_seq
    shape = (num_pages, block, hkv, dim)
    k = torch.randn(shape, device="cuda", dtype=torch.float16)
    v = torch.randn(shape, device="cuda", dtype=torch.float16)
    ks = vs = None
    if kv == "int8":
        k, ks = quantize_per_token(k)
        v, vs = quantize_per_token(v)
    tables = torch.randperm(num_pages, device="cuda").int().view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, dim, device="cuda", dtype=torch.float16)
    ms = _time_ms(
        lambda: triton_paged_decode_attention(q, k, v, tables, seq_lens, dim**-0.5, ks, vs)
    )
    moved = k.numel() * k.element_size() * 2 + (0 if ks is None else ks.nbytes * 2)
    moved += q.nbytes * 2 + tables.nbytes
    peak, source = _peak_bandwidth()
    achieved = moved / (ms / 1000)
    return {
        "kv": kv,
        "shape": {
            "batch": batch,
            "context": context,
            "q_heads": hq,
            "kv_heads": hkv,
            "head_dim": dim,
            "page_size": block,
        },
        "ms": round(ms, 4),
        "bytes": moved,
        "gb_per_s": round(achieved / 1e9, 1),
        "peak_gb_per_s": round(peak / 1e9, 1),
        "peak_source": source,
        "fraction_of_peak": round(achieved / peak, 3),
    }


def _w8a16_speed() -> list[dict[str, Any]]:
    import torch

    from cadenza.kernels.int8_linear import quantize_weight
    from cadenza.kernels.triton_int8_linear import triton_w8a16_matmul

    rows = []
    for m in (1, 16, 64):
        for n, k_dim in ((4096, 4096), (14336, 4096)):
            weight = torch.randn(n, k_dim, device="cuda", dtype=torch.float16)
            q_w, scale = quantize_weight(weight)
            x = torch.randn(m, k_dim, device="cuda", dtype=torch.float16)
            fp16_ms = _time_ms(lambda x=x, weight=weight: x @ weight.T)
            int8_ms = _time_ms(lambda x=x, q_w=q_w, scale=scale: triton_w8a16_matmul(x, q_w, scale))
            rows.append(
                {
                    "m": m,
                    "n": n,
                    "k": k_dim,
                    "fp16_ms": round(fp16_ms, 4),
                    "w8a16_ms": round(int8_ms, 4),
                    "speedup": round(fp16_ms / int8_ms, 2),
                }
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
