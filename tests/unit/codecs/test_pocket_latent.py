"""The Pocket TTS audio tokenizer, offline: decode is ``PocketTTSProcessor.decode`` sample for
sample (fade-in included), encode_audio is the latents ``PocketTTSProcessor`` gets for one
clip, codes are float32 bit patterns both ways; checkpoints load through the registry; bad
codes are refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import PocketTTSAudioTokenizerConfig, PocketTTSAudioTokenizerModel
from transformers.models.pocket_tts.feature_extraction_pocket_tts import PocketTTSFeatureExtractor
from transformers.models.pocket_tts.processing_pocket_tts import PocketTTSProcessor

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.pocket_latent import (
    PocketLatentCodec,
    codes_to_latents,
    is_pocket_audio_tokenizer_directory,
    latents_to_codes,
    load_pocket_audio_tokenizer,
)

FRAME = 1920
LATENT_DIM = 32


def tiny_pocket_config(**changes: object) -> PocketTTSAudioTokenizerConfig:
    """A small tokenizer with the real rates (24 kHz, 1920 samples a frame, 12.5 -> 25 Hz) and
    latent size, and a sliding window of 6 positions (3 frames), so a few frames slide it.
    Layer scales start at 1, not 0.01, so the transformers matter to the audio."""
    values: dict[str, object] = {
        "hidden_size": 32,
        "num_filters": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": 6,
        "upsample_groups": 32,
        "layer_scale_initial_scale": 1.0,
        "latent_dim": LATENT_DIM,
    }
    return PocketTTSAudioTokenizerConfig(**(values | changes))


def tiny_pocket_model(seed: int = 0) -> PocketTTSAudioTokenizerModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PocketTTSAudioTokenizerModel(tiny_pocket_config()).eval()


def random_latent_codes(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    """Codes ``[batch, latent_dim, frames]`` of standard normal latents."""
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, frames, LATENT_DIM, generator=generator)
    return latents_to_codes(latents).transpose(1, 2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pocket_audio_tokenizer")
    tiny_pocket_model().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def codec(checkpoint: Path) -> PocketLatentCodec:
    loaded = load_codec(str(checkpoint))
    assert isinstance(loaded, PocketLatentCodec)
    return loaded


def _processor(model: PocketTTSAudioTokenizerModel) -> SimpleNamespace:
    """What ``PocketTTSProcessor.decode`` and ``_process_audio`` read of their processor: the
    audio tokenizer, the feature extractor and the fade-in (the text side plays no part)."""
    return SimpleNamespace(
        audio_tokenizer=model,
        feature_extractor=PocketTTSFeatureExtractor(),
        fade_in_duration=0.005,
        replace_audio_token=lambda *args, **kwargs: "",
    )


def test_attributes(codec) -> None:
    assert (codec.sample_rate, codec.frame_size, codec.frame_rate) == (24000, FRAME, 12.5)
    assert (codec.num_codebooks, codec.codebook_size, codec.lookahead_frames) == (32, 2**32, 0)
    assert codec.streaming_dtypes == (torch.float32, torch.bfloat16)
    assert codec.fade_in.shape == (120,)


def test_bit_patterns_round_trip() -> None:
    latents = torch.tensor([0.5, 1.0, -0.0, -2.5, 3.4e38, 1e-45])
    codes = latents_to_codes(latents)
    assert codes.dtype == torch.int64
    assert codes[:3].tolist() == [0x3F000000, 0x3F800000, -(2**31)]
    assert codes.min() >= -(2**31) and codes.max() < 2**31
    back = codes_to_latents(codes)
    assert back.dtype == torch.float32
    assert torch.equal(back.view(torch.int32), latents.view(torch.int32))  # -0.0 included
    assert torch.equal(codes_to_latents(codes.to(torch.int32)), back)
    random = torch.randn(3, 5, LATENT_DIM, generator=torch.Generator().manual_seed(0))
    assert torch.equal(codes_to_latents(latents_to_codes(random)), random)
    assert torch.equal(
        latents_to_codes(random.to(torch.bfloat16)),
        latents_to_codes(random.to(torch.bfloat16).float()),
    )


def test_the_helpers_refuse_what_is_not_a_bit_pattern() -> None:
    with pytest.raises(CodecError, match="floats"):
        latents_to_codes(torch.zeros(3, dtype=torch.long))
    with pytest.raises(CodecError, match="integers"):
        codes_to_latents(torch.zeros(3))
    for outside in (2**31, -(2**31) - 1):
        with pytest.raises(CodecError, match="signed int32"):
            codes_to_latents(torch.tensor([0, outside]))


def test_decode_is_the_processors_decode(codec) -> None:
    codes = random_latent_codes(9, seed=1, batch=2)
    got = codec.decode(codes)
    assert got.shape == (2, 9 * FRAME) and got.dtype == torch.float32
    latents = codes_to_latents(codes).transpose(1, 2)  # [B, T, K], as generate returns them
    expected = PocketTTSProcessor.decode(_processor(codec.model), latents)
    for row in range(2):
        assert torch.equal(got[row], expected[row])
    one = PocketTTSProcessor.decode(_processor(codec.model), latents[1])
    assert torch.equal(codec.decode(codes[1:]), one[None])
    assert got[:, 0].abs().max() == 0 and got[:, 120:].abs().max() > 0  # faded in from 0


def test_decode_is_prefix_exact_and_takes_int32_codes(codec) -> None:
    codes = random_latent_codes(12, seed=2)
    full = codec.decode(codes)
    prefix = codec.decode(codes[..., :5])
    assert (prefix - full[:, : 5 * FRAME]).abs().max() <= 1e-6 * full.abs().max()
    assert torch.equal(codec.decode(codes.to(torch.int32)), full)
    assert codec.decode(codes[..., :0]).shape == (1, 0)


def test_a_fade_longer_than_the_audio_fades_all_of_it(codec) -> None:
    slow = PocketLatentCodec(codec.model, fade_in_s=1.0)  # 24000 samples: 12.5 frames
    codes = random_latent_codes(3, seed=3)
    with torch.no_grad():
        unfaded = codec.model.decode(codes_to_latents(codes).transpose(1, 2)).audio_values[:, 0]
    expected = unfaded * torch.linspace(0, 1, 24000)[: 3 * FRAME]
    assert torch.equal(slow.decode(codes), expected)


@pytest.mark.parametrize("samples", [9 * FRAME, 9 * FRAME + 7, 5 * FRAME - 1000, 300])
def test_encode_audio_is_the_processors_voice_latents(codec, samples) -> None:
    rng = np.random.default_rng(samples)
    audio = (0.3 * rng.standard_normal(samples)).astype(np.float32)
    audio[-samples // 4 :] *= 1e-3  # trailing near-silence, which ending on a pause cuts
    codes = codec.encode_audio(audio)
    processed, _ = PocketTTSProcessor._process_audio(
        _processor(codec.model), [audio], sampling_rate=24000
    )
    mask = processed["audio_latents_mask"][0].bool()
    expected = processed["audio_latents"][0][mask]  # [frames, K]
    assert codes.shape == (LATENT_DIM, expected.shape[0]) and codes.dtype == torch.int64
    assert torch.equal(codes_to_latents(codes).T, expected)


def test_encode_audio_follows_the_checkpoints_feature_extractor(codec, tmp_path) -> None:
    codec.model.save_pretrained(tmp_path)
    PocketTTSFeatureExtractor(end_on_pause=False).save_pretrained(tmp_path)
    plain = load_pocket_audio_tokenizer(str(tmp_path))
    assert plain.feature_extractor.end_on_pause is False
    samples = 5 * FRAME + 11
    audio = (0.3 * np.random.default_rng(0).standard_normal(samples)).astype(np.float32)
    codes = plain.encode_audio(audio)
    assert codes.shape == (LATENT_DIM, math.ceil(samples / FRAME))
    padded = torch.zeros(1, 1, 6 * FRAME)
    padded[0, 0, :samples] = torch.from_numpy(audio)
    with torch.no_grad():
        expected = codec.model.encode(padded).latents[0]
    assert torch.equal(codes_to_latents(codes).T, expected)


def test_encode_audio_refuses_bad_audio(codec) -> None:
    for bad in (np.zeros(0, np.float32), np.zeros((2, 10), np.float32)):
        with pytest.raises(CodecError, match="non-empty mono"):
            codec.encode_audio(bad)
    decoder_only = PocketTTSAudioTokenizerModel(tiny_pocket_config(encoder_config=None))
    with pytest.raises(CodecError, match="no encoder"):
        PocketLatentCodec(decoder_only).encode_audio(np.ones(FRAME, np.float32))


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (torch.zeros(1, 31, 5, dtype=torch.long), r"\[batch, 32, frames\]"),
        (torch.zeros(32, 5, dtype=torch.long), r"\[batch, 32, frames\]"),
        (torch.zeros(1, 32, 5), "integers"),
        (torch.full((1, 32, 5), 2**31), "signed int32"),
        (torch.full((1, 32, 5), -(2**31) - 1), "signed int32"),
        (torch.full((1, 32, 5), 0x7FC00000), "finite"),  # NaN
        (torch.full((1, 32, 5), 0x7F800000), "finite"),  # +inf
    ],
)
def test_bad_codes_are_refused(codec, codes, message) -> None:
    with pytest.raises(CodecError, match=message):
        codec.decode(codes)


def test_streaming_dtypes_other_than_float32_and_bf16_are_refused(codec) -> None:
    with pytest.raises(CodecError, match="float32 or bfloat16"):
        codec.streaming_decoder(1, torch.float16)


# -- loading --------------------------------------------------------------------------------


def test_the_registry_loads_a_tokenizer_directory(checkpoint, codec) -> None:
    assert is_pocket_audio_tokenizer_directory(checkpoint)
    codes = random_latent_codes(4, seed=5)
    with torch.no_grad():
        expected = tiny_pocket_model().decode(codes_to_latents(codes).transpose(1, 2))
    audio = expected.audio_values[:, 0]
    audio[:, :120] *= torch.linspace(0, 1, 120)
    assert torch.equal(codec.decode(codes), audio)  # the saved weights, loaded strictly


def test_refuses_what_is_not_a_tokenizer(checkpoint, tmp_path) -> None:
    assert not is_pocket_audio_tokenizer_directory(tmp_path)
    with pytest.raises(CodecError, match="pocket_tts_audio_tokenizer"):
        load_pocket_audio_tokenizer(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimi"}))
    assert not is_pocket_audio_tokenizer_directory(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert not is_pocket_audio_tokenizer_directory(tmp_path)


def test_refuses_a_tokenizer_with_missing_weights(checkpoint, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    state = load_file(checkpoint / "model.safetensors")
    del state["latent_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match="do not fit"):
        load_codec(str(tmp_path))
