"""SNAC against the reference ``snac`` package, and streaming against offline decoding.

Checkpoints are built with the ``snac`` package itself (small random models in the 24 kHz
model's architecture: the same rates and strides, fewer channels) and saved as the public
checkpoint is (``config.json`` + ``pytorch_model.bin``, new-style weight-norm keys). Noise is
off on both sides: the reference's noise layers are replaced by the identity.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from cadenza.codecs import load_codec
from cadenza.codecs.codec import CodecError
from cadenza.codecs.snac import SNAC_24KHZ_CONFIG, SnacCodec, load_snac
from cadenza.codecs.snac_streaming import SnacStreamingDecoder
from cadenza.engine.device_audit import DeviceAudit
from tests.support.legacy_weight_norm import legacy_weight_norm_names

snac = pytest.importorskip("snac")

SMALL = {**SNAC_24KHZ_CONFIG.model_dump(), "encoder_dim": 8, "decoder_dim": 64, "codebook_dim": 4}


def _reference(config: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = snac.SNAC(**config).eval()
    with torch.no_grad():  # trained weight norms are far from the init's all-equal ones
        for name, parameter in model.named_parameters():
            if name.endswith("original0") or name.endswith("alpha"):
                parameter.mul_(torch.rand_like(parameter) + 0.5)
    return model


def _silence_noise(model: torch.nn.Module) -> None:
    for module in model.modules():
        if type(module).__name__ == "NoiseBlock":
            module.forward = lambda x: x  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    directory = tmp_path_factory.mktemp("snac_small")
    reference = _reference(SMALL, seed=3)
    (directory / "config.json").write_text(json.dumps(SMALL))
    torch.save(reference.state_dict(), directory / "pytorch_model.bin")
    _silence_noise(reference)
    return directory, reference


@pytest.fixture(scope="module")
def codec(checkpoint) -> SnacCodec:
    loaded = load_codec(str(checkpoint[0]), noise=False)
    assert isinstance(loaded, SnacCodec)
    return loaded


def _codes(codec: SnacCodec, frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, codec.codebook_size, (batch, 7, frames), generator=generator)


def test_frames_hold_seven_codes_in_level_order(codec) -> None:
    assert (codec.num_codebooks, codec.hop_length, codec.sample_rate) == (7, 2048, 24000)
    codes = _codes(codec, 3, seed=0)
    l0, l1, l2 = codec.levels(codes)
    assert l0.tolist() == [codes[0, 0].tolist()]
    assert l1[0, 2:4].tolist() == codes[0, 1:3, 1].tolist()
    assert l2[0, 4:8].tolist() == codes[0, 3:7, 1].tolist()
    assert torch.equal(codec.frames([l0, l1, l2]), codes)


def test_offline_decode_equals_the_snac_package(checkpoint, codec) -> None:
    _, reference = checkpoint
    codes = _codes(codec, 9, seed=1, batch=2)
    with torch.no_grad():
        expected = reference.decode(codec.levels(codes))[:, 0]
    got = codec.decode(codes)
    assert got.shape == (2, 9 * 2048)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("decoder_only", [False, True])
def test_old_style_weight_norm_keys_load_the_same(
    checkpoint, codec, tmp_path, decoder_only
) -> None:
    """hubertsiuzdak/snac_24khz stores ``weight_g`` / ``weight_v``; a mixture of both styles
    loads too."""
    directory, _ = checkpoint
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    renamed = legacy_weight_norm_names(
        state, lambda name: not decoder_only or name.startswith("decoder.")
    )
    assert any(key.endswith(".weight_g") for key in renamed)
    assert any(".parametrizations." in key for key in renamed) == decoder_only
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    torch.save(renamed, tmp_path / "pytorch_model.bin")
    codes = _codes(codec, 4, seed=2)
    torch.testing.assert_close(
        load_snac(str(tmp_path), noise=False).decode(codes), codec.decode(codes)
    )


def test_a_weight_named_both_ways_is_refused(checkpoint, tmp_path) -> None:
    directory, _ = checkpoint
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    name = "decoder.model.0.parametrizations.weight.original1"
    state[name.removesuffix(".parametrizations.weight.original1") + ".weight_v"] = state[name]
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(CodecError, match="weight norm named both ways"):
        load_snac(str(tmp_path))


def _chunks(total: int, rng: random.Random) -> list[int]:
    sizes = []
    while total > 0:
        size = min(total, rng.choice([0, 1, 1, 2, 3, 5]))
        sizes.append(size)
        total -= size
    return sizes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_offline_for_any_chunking_and_interleaving(codec, seed) -> None:
    rng = random.Random(seed)
    lengths = [1, 2, 7, 12]
    codes = [_codes(codec, n, seed=10 * seed + i)[0] for i, n in enumerate(lengths)]
    decoder = codec.streaming_decoder(max_streams=4)
    slots = [decoder.open() for _ in lengths]
    plans = [_chunks(n, rng) for n in lengths]
    sent = [0] * len(lengths)
    audio: list[list[torch.Tensor]] = [[] for _ in lengths]
    while any(plans):
        batch, final = {}, set()
        for i, plan in enumerate(plans):
            if plan and rng.random() < 0.7:
                size = plan.pop(0)
                batch[slots[i]] = codes[i][:, sent[i] : sent[i] + size]
                sent[i] += size
                if not plan:
                    final.add(slots[i])
        for slot, samples in decoder.decode(batch, frozenset(final)).items():
            audio[slots.index(slot)].append(samples)
    assert decoder.open_slots == frozenset()
    for i, n in enumerate(lengths):
        streamed = torch.cat(audio[i])
        torch.testing.assert_close(streamed, codec.decode(codes[i][None])[0], atol=2e-5, rtol=1e-4)
        assert streamed.shape == (n * 2048,)


def test_the_decoder_looks_ahead_about_4760_samples(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    assert isinstance(decoder, SnacStreamingDecoder)
    assert decoder.lookahead_samples == 4757
    slot = decoder.open()
    first = decoder.decode({slot: _codes(codec, 4, seed=0)[0]})[slot]
    assert first.numel() == 4 * 2048 - 4757
    assert decoder.close(slot).numel() == 4757  # type: ignore[union-attr]


def test_noise_comes_from_each_streams_own_generator() -> None:
    codec = load_snac(noise=True)
    codes = torch.randint(0, 4096, (7, 3), generator=torch.Generator().manual_seed(0))
    plain = load_snac(noise=False).decode(codes[None])[0]
    decoder = codec.streaming_decoder(max_streams=2)
    a, b = decoder.open(), decoder.open()
    out = decoder.decode({a: codes, b: codes}, final=frozenset({a, b}))
    assert not torch.equal(out[a], out[b])  # two streams, two noise draws
    assert not torch.allclose(out[a], plain)
    assert out[a].abs().max() <= 1.0


def test_a_decode_call_reads_its_audio_back_once_and_uploads_without_blocking() -> None:
    # Every stage knows its slots on the host (no read to learn them); the codes and lengths go
    # up through pinned uploads; the batch's audio comes back in one read. (Noise on: its
    # generators are per slot on the host.)
    decoder = load_snac(noise=True).streaming_decoder(max_streams=3)
    slots = [decoder.open() for _ in range(3)]
    codes = torch.randint(0, 4096, (7, 4), generator=torch.Generator().manual_seed(1))
    with DeviceAudit() as audit:
        out = decoder.decode({slot: codes[:, : 2 + slot] for slot in slots})
    assert audit.reads["cpu"] == 1 and "tolist" not in audit.reads
    assert audit.blocking_uploads == 0
    assert all(pcm.device.type == "cpu" and pcm.dtype == torch.float32 for pcm in out.values())


def test_bad_codes_and_configs_are_refused(codec, tmp_path) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    slot = decoder.open()
    for bad in (torch.full((7, 2), 4096), torch.zeros(6, 2, dtype=torch.long), torch.zeros(7)):
        with pytest.raises(CodecError):
            decoder.decode({slot: bad})
    with pytest.raises(CodecError):
        decoder.open()
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "attn_window_size": 32}))
    with pytest.raises(CodecError, match="local attention"):
        load_codec(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "decoder_rates": "x"}))
    with pytest.raises(CodecError, match="not a SNAC config"):
        load_codec(str(tmp_path))
