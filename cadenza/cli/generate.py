"""``cadenza generate``: one utterance, synthesized offline into a WAV file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cadenza.cli.options import add_model_flags, command_parser
from cadenza.config import CadenzaConfig


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    generate = command_parser(
        commands, "generate", "synthesize one utterance offline into a WAV file"
    )
    generate.add_argument("--text", required=True, help="the text to speak")
    generate.add_argument("--out", required=True, type=Path, help="output WAV path")
    generate.add_argument("--voice", default="default")
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
    from cadenza.engine.models.bark.bark_recognition import bark_directory
    from cadenza.hub_cache import NotInHubCache

    try:
        bark = bark_directory(config.model.name)
    except NotInHubCache as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    if bark is not None:
        return _run_bark(bark, args)
    from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis
    from cadenza.edge.media.wav import wav_file_bytes
    from cadenza.engine.engine import Engine
    from cadenza.engine.models.registry import CheckpointError, UnknownModelError
    from cadenza.engine.offline import synthesize

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
    except (UnknownModelError, CheckpointError, InvalidRequest, ValueError, NotInHubCache) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    audio = synthesize(
        engine,
        args.text,
        voice=args.voice,
        max_duration_s=args.max_duration_s,
        sampling=sampling,
    )
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


def _run_bark(directory: Path, args: argparse.Namespace) -> int:
    """Bark's three stages offline: ``--temperature`` is the semantic and coarse stages'
    (0 or none: greedy, as ``transformers`` runs Bark by default), ``--fine-temperature`` the
    fine stage's; ``--voice`` a preset (``default``: none)."""
    from cadenza.edge.media.wav import wav_file_bytes
    from cadenza.engine.models.bark.bark_offline import synthesize_bark
    from cadenza.engine.models.bark.bark_request import BarkRequestError, BarkSampling
    from cadenza.engine.models.registry import CheckpointError

    if args.top_k or args.top_p or args.min_p or args.repetition_penalty or args.guidance_scale:
        print(
            "cadenza: Bark takes --temperature, --fine-temperature, --seed and --max-duration-s",
            file=sys.stderr,
        )
        return 2
    temperature = args.temperature or None
    started = time.perf_counter()
    try:
        sampling = BarkSampling(
            semantic_temperature=temperature,
            coarse_temperature=temperature,
            fine_temperature=args.fine_temperature or None,
            seed=args.seed or 0,
        )
        made = synthesize_bark(directory, args.text, args.voice, sampling, args.max_duration_s)
    except (CheckpointError, BarkRequestError) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    args.out.write_bytes(wav_file_bytes(made.audio, made.sample_rate))
    summary = {
        "out": str(args.out),
        "audio_s": round(len(made.audio) / made.sample_rate, 3),
        "synthesis_s": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(summary))
    return 0
