"""``cadenza generate``: one utterance, synthesized offline into a WAV file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cadenza.cli.options import add_model_flags, command_parser
from cadenza.config import CadenzaConfig

if TYPE_CHECKING:
    from cadenza.contract.request import ContextTurn
    from cadenza.engine.engine import Engine


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    generate = command_parser(
        commands, "generate", "synthesize one utterance offline into a WAV file"
    )
    generate.add_argument("--text", required=True, help="the text to speak")
    generate.add_argument("--out", required=True, type=Path, help="output WAV path")
    generate.add_argument("--voice", default="default")
    generate.add_argument(
        "--voice-audio",
        type=Path,
        help="a WAV clip of the voice to speak in, resampled to the codec's rate: the turn "
        "before the utterance for a model that takes context (Dia, CSM), else its speech "
        "prompt (Pocket TTS clones the voice)",
    )
    generate.add_argument("--voice-text", help="the transcript of --voice-audio (Dia needs it)")
    generate.add_argument("--seed", type=int, help="sampling seed (same seed, same audio)")
    generate.add_argument("--max-duration-s", type=float, help="cap on the audio length")
    generate.add_argument("--temperature", type=float, help="0: greedy (default: the model's)")
    generate.add_argument("--top-k", type=int, help="0: off (default: the model's)")
    generate.add_argument("--top-p", type=float, help="1: off (default: the model's)")
    generate.add_argument("--min-p", type=float, help="0: off (default: the model's)")
    generate.add_argument(
        "--fine-temperature", type=float, help="Bark's fine stage (0 or none: greedy)"
    )
    generate.add_argument(
        "--guidance-scale",
        type=float,
        help="classifier-free guidance of a guided model (Dia, MusicGen; default: the model's)",
    )
    generate.add_argument("--repetition-penalty", type=float, help="1: off (default: the model's)")
    generate.add_argument(
        "--codec-noise",
        choices=["on", "off"],
        help="SNAC's noise layers (off: the same tokens always give the same audio)",
    )
    add_model_flags(generate)
    generate.set_defaults(run=run)


def run(config: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.contract.errors import RequestRejected
    from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis
    from cadenza.edge.media.wav import wav_file_bytes
    from cadenza.engine.engine import Engine
    from cadenza.engine.models.registry import CheckpointError, UnknownModelError
    from cadenza.engine.offline import synthesize
    from cadenza.hub_cache import NotInHubCache

    started = time.perf_counter()
    try:
        engine = Engine.from_config(config)
        sampling = engine.model.default_sampling.with_overrides(
            seed=args.seed,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            fine_temperature=args.fine_temperature,
            guidance_scale=args.guidance_scale,
        )
        validate_synthesis(
            model=config.model.name,
            text=args.text,
            voice=args.voice,
            max_duration_s=args.max_duration_s,
            served_model=engine.model_name,
            voices=engine.voices,
            limits=config.limits,
            sampling=sampling,
            sampling_fields=tuple(engine.model.sampling_fields),
        )
        context, prompt_audio = _voice_clip(args, engine)
    except (UnknownModelError, CheckpointError, InvalidRequest, ValueError, NotInHubCache) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    try:
        audio = synthesize(
            engine,
            args.text,
            voice=args.voice,
            max_duration_s=args.max_duration_s,
            sampling=sampling,
            context=context,
            prompt_audio=prompt_audio,
        )
    except RequestRejected as exc:
        clip = " (the voice clip: --voice-audio, --voice-text)" if args.voice_audio else ""
        print(f"cadenza: {exc}{clip}", file=sys.stderr)
        return 2
    done = time.perf_counter()
    args.out.write_bytes(wav_file_bytes(audio, engine.sample_rate))
    summary = {
        "out": str(args.out),
        "audio_s": round(len(audio) / engine.sample_rate, 3),
        "load_s": round(loaded - started, 3),
        "synthesis_s": round(done - loaded, 3),
    }
    print(json.dumps(summary))
    return 0


def _voice_clip(args: argparse.Namespace, engine: Engine) -> tuple[tuple[ContextTurn, ...], bytes]:
    """``--voice-audio`` (at the codec's rate) and its transcript ``--voice-text``: for a
    model that takes context, the conversation turn the utterance follows; for another, the
    clip as its speech prompt (float32 samples; no transcript). Neither without a clip.
    Raises ``ValueError``."""
    from cadenza.contract.request import ContextTurn
    from cadenza.edge.media.resampler import SUPPORTED_RATES, ResampleError, resample
    from cadenza.edge.media.wav import read_wav

    path = args.voice_audio
    if path is None:
        if args.voice_text is not None:
            raise ValueError("--voice-text is the transcript of --voice-audio: give the clip")
        return (), b""
    if not engine.info.takes_context and args.voice_text is not None:
        raise ValueError(
            f"--voice-text: {engine.model_name} takes the clip as a speech prompt, without "
            "its transcript"
        )
    try:
        samples, rate = read_wav(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--voice-audio {path}: {exc}") from exc
    target = engine.sample_rate
    if rate != target:
        try:
            samples = resample(samples, rate, target)
        except ResampleError as exc:
            rates = ", ".join(str(r) for r in SUPPORTED_RATES)
            raise ValueError(
                f"--voice-audio {path} is at {rate} Hz; the model's codec takes {target} Hz and "
                f"clips are resampled from {rates} Hz only: convert it to {target} Hz"
            ) from exc
    audio = samples.astype("<f4").tobytes()
    if not engine.info.takes_context:
        return (), audio
    return (ContextTurn(voice=args.voice, text=args.voice_text or "", audio=audio),), b""
