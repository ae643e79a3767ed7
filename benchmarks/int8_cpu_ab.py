"""What the CPU's int8 path (VNNI, through ``torch.ao``'s fbgemm/x86 kernels, activations
quantized per call) would buy and cost where cadenza-tiny's engine now multiplies in bf16: the
output heads and the streaming codec decoder's wide layers. Side by side in one process, one
thread.

    .venv/bin/python benchmarks/int8_cpu_ab.py --rounds 5

* **Heads** (256 -> 8 x 1,026): the native bf16 product (``PackedLinear``, what the engine
  runs) against W8A8 dynamic (``quantized.linear_dynamic``, per-channel int8 weights) at 1, 8
  and 16 rows, calls alternating, medians. Accuracy on the hidden states the engine itself
  feeds its heads while synthesizing (captured with a hook): per-codebook top-1 agreement with
  the float32 product and the logits' cosine, for bf16 and for int8.
* **Codec**: the streaming EnCodec decoder in bf16 (the engine's) against a copy whose wide
  layers run int8: the LSTM (``quantize_dynamic``) and every conv computed as one matrix
  product (256 or more input channels, ``codecs.ragged.Conv``) through ``linear_dynamic``.
  Calls of the shapes a served engine makes, alternating, medians; and the audio of four
  150-frame streams decoded in 15-frame chunks, SNR against the float32 streaming decode.
* **Every conv shape** of ``codec_convs.py`` (EnCodec's decoder at 16 streams x 15 frames,
  Mimi's wide ones at 8 streams): ``codecs.ragged.Conv`` in bf16 (what the engine runs) against
  fbgemm's quantized conv (int8 per-channel weights, the input quantized per call, the output
  dequantized), medians.
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder
from cadenza.codecs.ragged import Conv
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.engine.engine import Engine
from cadenza.engine.offline import synthesize
from cadenza.kernels.cpu_linear import PackedLinear

sys.path.insert(0, str(Path(__file__).resolve().parent))
from codec_convs import SHAPES as CONV_SHAPES  # the decoders' convs

HEAD_ROWS = (1, 8, 16)
CODEC_SHAPES = [[8], [15] * 2, [15] * 8, [15, 15, 15, 8, 5]]


def _median_ms(call: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000.0 * statistics.median(times)


def _int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Callable[..., Any]:
    """``x @ weight.T + bias`` as W8A8 dynamic: int8 weights with per-output-channel scales."""
    weight = weight.float()
    scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.float())
    return lambda x: torch.ops.quantized.linear_dynamic(x.float().contiguous(), packed)


def heads(engine: Engine, rounds: int) -> None:
    heads_layer: Any = engine.model.heads
    weight = heads_layer.weight.detach().float()
    native = PackedLinear(weight, torch.bfloat16)
    assert native.pairs is not None, "no native bf16 product on this machine"
    int8 = _int8_linear(weight, None)
    captured: list[torch.Tensor] = []
    hook = heads_layer.register_forward_hook(
        lambda _m, args, _out: captured.append(args[0].detach().float().clone())
    )
    synthesize(engine, "Heads see what the engine feeds them.", max_duration_s=3.0)
    hook.remove()
    hidden = torch.cat(captured)
    print(f"\nheads: {weight.shape[1]} -> {weight.shape[0]}, one thread, medians")
    print("| rows | native bf16 ms | W8A8 ms | bf16 / W8A8 |")
    print("| --- | --- | --- | --- |")
    for rows in HEAD_ROWS:
        x = hidden[:rows].contiguous()
        samples: dict[str, list[float]] = {"bf16": [], "int8": []}
        for _ in range(rounds):
            samples["bf16"].append(_median_ms(functools.partial(native, x), 200))
            samples["int8"].append(_median_ms(functools.partial(int8, x), 200))
        bf16, w8 = (statistics.median(samples[k]) for k in ("bf16", "int8"))
        print(f"| {rows} | {bf16:.4f} | {w8:.4f} | {bf16 / w8:.2f}x |")
    reference = hidden @ weight.T
    codebooks: int = cast(Any, engine.model).spec.num_codebooks
    print(f"\naccuracy on {hidden.shape[0]} hidden states the engine fed its heads:")
    print("| setting | top-1 agreement with fp32 | logits cosine mean / worst |")
    print("| --- | --- | --- |")
    for name, out in (("bf16 native", native(hidden)), ("W8A8", int8(hidden))):
        ref = reference.view(-1, codebooks, weight.shape[0] // codebooks)
        got = out.view_as(ref)
        agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
        cosine = nn.functional.cosine_similarity(ref, got, dim=-1)
        print(
            f"| {name} | {100 * agree:.1f} % | "
            f"{cosine.mean().item():.5f} / {cosine.min().item():.5f} |"
        )


def _int8_codec(
    decoder: EncodecStreamingDecoder, lstm: bool = True, convs: bool = True
) -> EncodecStreamingDecoder:
    """A copy of ``decoder`` whose LSTM and/or product convs run int8."""
    copy_ = EncodecStreamingDecoder(decoder.codec, 8, decoder.compute_dtype)
    count = 0
    for stage in _walk(copy_._stages):
        if lstm and hasattr(stage, "native") and hasattr(stage, "lstm"):  # the LSTM stage
            float_lstm = copy.deepcopy(stage.lstm).float()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantized = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
                    nn.Sequential(float_lstm), {nn.LSTM}, dtype=torch.qint8
                )[0]
            stage.native, stage.lstm = None, quantized
            stage.h, stage.c = stage.h.float(), stage.c.float()
            plain_forward = stage.forward

            def forward(x: torch.Tensor, *rest: Any, _plain: Any = plain_forward) -> Any:
                out, lengths = _plain(x.float(), *rest)
                return out.to(torch.bfloat16), lengths

            stage.forward = forward
            count += 1
        conv = getattr(stage, "conv", None)
        if convs and isinstance(conv, Conv) and conv.matrix is not None:
            product = _int8_linear(conv.matrix.T, conv.bias)

            def _product(self: Conv, storage: torch.Tensor, _p: Any = product) -> torch.Tensor:
                batch, steps = storage.shape[0], storage.shape[1] - (self.kernel - 1)
                taps = [storage[:, j : j + steps] for j in range(self.kernel)]
                columns = torch.cat(taps, dim=-1).reshape(batch * steps, -1)
                out = _p(columns).to(torch.bfloat16)
                return out.view(batch, steps, self.out_channels).transpose(1, 2)

            conv._product = types.MethodType(_product, conv)  # type: ignore[method-assign]
            count += 1
    assert count >= 1, "no layer switched to int8"
    return copy_


def _walk(stages: list[Any]) -> list[Any]:
    found = []
    for stage in stages:
        found.append(stage)
        found += _walk(getattr(stage, "block", []))
        shortcut = getattr(stage, "shortcut", None)
        if shortcut is not None:
            found += _walk([shortcut])
    return found


def _stream_audio(decoder: EncodecStreamingDecoder, codes: torch.Tensor) -> torch.Tensor:
    slots = [decoder.open() for _ in range(codes.shape[0])]
    pieces: list[list[torch.Tensor]] = [[] for _ in slots]
    for start in range(0, codes.shape[-1], 15):
        out = decoder.decode({s: codes[i, :, start : start + 15] for i, s in enumerate(slots)})
        for i, s in enumerate(slots):
            pieces[i].append(out[s].flatten())
    for i, s in enumerate(slots):
        tail = decoder.close(s)
        if tail is not None:
            pieces[i].append(tail.flatten().float())
    return torch.stack([torch.cat(p) for p in pieces])


def _snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = (reference - other).pow(2).sum().item()
    return 10 * math.log10(reference.pow(2).sum().item() / max(noise, 1e-30))


def codec(engine: Engine, rounds: int) -> None:
    bf16: Any = engine._audio_stage().decoder
    decoders = {
        "bf16": bf16,
        "int8 LSTM": _int8_codec(bf16, convs=False),
        "int8 product convs": _int8_codec(bf16, lstm=False),
        "int8": _int8_codec(bf16),
    }
    slots = {
        name: SlotBatch.on([d.open() for _ in range(8)], "cpu") for name, d in decoders.items()
    }
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(rounds + 1):  # the first round warms up, unrecorded
        for shape in CODEC_SHAPES:
            codes = torch.randint(0, 1024, (len(shape), 8, max(shape)))
            for _ in range(5):
                for name, decoder in decoders.items():
                    count = len(shape)
                    started = time.perf_counter()
                    decoder.decode_batch(
                        codes, shape, slots[name].rows(list(range(count))), [False] * count
                    )
                    if round_:
                        ms = 1000 * (time.perf_counter() - started)
                        times.setdefault((str(shape), name), []).append(ms)
    for name, decoder in decoders.items():
        for slot in slots[name].ids:
            decoder.release(slot)
    print("\ncodec calls, one thread, medians")
    print("| frames per stream in the call | " + " | ".join(f"{n} ms" for n in decoders) + " |")
    print("| --- " * (len(decoders) + 1) + "|")
    for shape in CODEC_SHAPES:
        base = statistics.median(times[(str(shape), "bf16")])
        cells = [f"{base:.2f}"]
        for name in list(decoders)[1:]:
            ms = statistics.median(times[(str(shape), name)])
            cells.append(f"{ms:.2f} ({base / ms:.2f}x)")
        print(f"| {shape} | " + " | ".join(cells) + " |")
    torch.manual_seed(0)
    codes = torch.randint(0, 1024, (4, 8, 150))
    reference = _stream_audio(EncodecStreamingDecoder(bf16.codec, 8, torch.float32), codes)
    audio = {name: _stream_audio(decoder, codes) for name, decoder in decoders.items()}
    for name in decoders:
        print(f"SNR of the {name} stream against float32: {_snr_db(reference, audio[name]):.1f} dB")
    print(f"SNR of the int8 stream against bf16: {_snr_db(audio['bf16'], audio['int8']):.1f} dB")
    print("(every int8 layer quantizes its activations per call, over the call's whole batch)")


def convs(rounds: int) -> None:
    print("\nconvs, one thread, medians")
    print("| batch, C_in, C_out, T, k | bf16 ms (cadenza) | int8 ms (fbgemm) | bf16 / int8 |")
    print("| --- | --- | --- | --- |")
    for batch, c_in, c_out, steps, kernel in CONV_SHAPES:
        x = torch.randn(batch, steps, c_in).transpose(1, 2)  # time-major
        weight = torch.randn(c_out, c_in, kernel) / (c_in * kernel) ** 0.5
        bias = 0.1 * torch.randn(c_out)
        conv = Conv(weight.bfloat16(), bias.bfloat16())
        x16 = x.bfloat16()
        scales = (weight.abs().amax(dim=(1, 2)) / 127.0).double()
        zeros = torch.zeros(c_out, dtype=torch.long)
        quantized = torch.quantize_per_channel(weight.unsqueeze(2), scales, zeros, 0, torch.qint8)
        packed = torch.ops.quantized.conv2d_prepack(quantized, bias, [1, 1], [0, 0], [1, 1], 1)
        x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        reference = torch.nn.functional.conv1d(x, weight, bias)
        out_scale = float(reference.abs().max()) / 127.0

        def int8(x4: torch.Tensor = x4, packed: Any = packed, out_scale: float = out_scale) -> Any:
            low, high = torch.aminmax(x4)
            scale = max(float(high - low), 1e-8) / 255.0
            q = torch.quantize_per_tensor(x4, scale, round(-float(low) / scale), torch.quint8)
            return torch.ops.quantized.conv2d(q, packed, out_scale, 128).dequantize()

        samples: dict[str, list[float]] = {"bf16": [], "int8": []}
        for _ in range(rounds):
            samples["bf16"].append(_median_ms(functools.partial(conv, x16), 10))
            samples["int8"].append(_median_ms(int8, 10))
        bf16, w8 = (statistics.median(samples[k]) for k in ("bf16", "int8"))
        shape = f"{batch}, {c_in}, {c_out}, {steps}, {kernel}"
        print(f"| {shape} | {bf16:.2f} | {w8:.2f} | {bf16 / w8:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.backends.quantized.engine = "x86"
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=64 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's quantized tensors are deprecated
        heads(engine, args.rounds)
        codec(engine, args.rounds)
        convs(args.rounds)


if __name__ == "__main__":
    main()
