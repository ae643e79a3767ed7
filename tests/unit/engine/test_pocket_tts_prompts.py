"""A Pocket TTS checkpoint's prompts as its processor makes them (the chat template, the
voice placeholders, the tail after the end of speech by word count), its preset voices, and
the processor files it cannot use refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.pocket_tts_checkpoint import pocket_tts_spec
from cadenza.engine.models.pocket_tts_prompts import load_prompts, load_voice_presets
from tests.support.pocket_tts_checkpoints import (
    AUDIO_BOS_ID,
    AUDIO_PROMPT_BOS_ID,
    AUDIO_PROMPT_ID,
    LATENT_DIM,
    VOICE_FRAMES,
    load_voice,
    reference_frames_after_eos,
    reference_prompt_ids,
    write_pocket_tts_checkpoint,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_pocket_tts_checkpoint(tmp_path_factory.mktemp("pocket") / "pocket-tiny")


def _prompts(directory: Path):
    config = json.loads((directory / "config.json").read_text())
    return load_prompts(directory, pocket_tts_spec(directory, config))


def test_a_prompt_is_the_processors_with_and_without_a_voice(checkpoint) -> None:
    prompts = _prompts(checkpoint)
    for text in ("Hello world.", "  lower case, no stop ", "One two three four five six."):
        ids = prompts.render(text, 0)
        assert ids == reference_prompt_ids(checkpoint, text)
        assert prompts.frames_after_eos(ids) == reference_frames_after_eos(checkpoint, text)
        voiced = prompts.render(text, VOICE_FRAMES["alba"])
        assert voiced == reference_prompt_ids(checkpoint, text, voice="alba")
        assert (
            voiced[: 1 + VOICE_FRAMES["alba"]]
            == [AUDIO_PROMPT_BOS_ID] + [AUDIO_PROMPT_ID] * VOICE_FRAMES["alba"]
        )
        assert voiced[-1] == AUDIO_BOS_ID


def test_the_overhead_prompt_has_no_text(checkpoint) -> None:
    assert _prompts(checkpoint).render("", 0) == [AUDIO_BOS_ID]


def test_preset_voices_load_as_published(checkpoint) -> None:
    presets = load_voice_presets(checkpoint, LATENT_DIM)
    assert sorted(presets) == sorted(VOICE_FRAMES)
    for name, latents in presets.items():
        assert torch.equal(latents, load_voice(checkpoint, name))
    assert load_voice_presets(checkpoint / "nowhere", LATENT_DIM) == {}


@pytest.mark.parametrize(
    ("tensors", "name", "message"),
    [
        ({"other": torch.zeros(3, LATENT_DIM)}, "odd", "not a voice"),
        ({"audio_prompt_latents": torch.zeros(3, LATENT_DIM + 1)}, "wide", "a voice is"),
        ({"audio_prompt_latents": torch.zeros(3, LATENT_DIM)}, "default", "without a prompt"),
    ],
)
def test_a_voice_file_it_cannot_use_is_refused(tmp_path, tensors, name, message) -> None:
    (tmp_path / "voices").mkdir()
    save_file(tensors, str(tmp_path / "voices" / f"{name}.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        load_voice_presets(tmp_path, LATENT_DIM)


def test_processor_files_that_disagree_with_the_config_are_refused(tmp_path) -> None:
    directory = write_pocket_tts_checkpoint(tmp_path / "pocket")
    settings_path = directory / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text())
    settings_path.write_text(json.dumps({**settings, "audio_bos_token": "<|audio_latent|>"}))
    with pytest.raises(CheckpointError, match="audio_bos_token must be the token of id 4003"):
        _prompts(directory)
    settings_path.write_text(json.dumps(settings))
    (directory / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(CheckpointError, match="chat template does not compile"):
        _prompts(directory)
    (directory / "chat_template.jinja").unlink()
    with pytest.raises(CheckpointError, match="no chat template"):
        _prompts(directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        _prompts(directory)
