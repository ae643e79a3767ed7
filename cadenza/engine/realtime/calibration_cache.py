"""The calibration cache: what a calibration is keyed by (everything that changes what a step
costs on this machine), where it is stored, and reading and writing it. A cached calibration
that contradicts itself is never read back (:mod:`.calibration_checks`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import torch
from pydantic import ValidationError

from cadenza.contract.calibration import CALIBRATION_ADAPTER, Calibration
from cadenza.engine.device import device_name
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.calibration_checks import calibration_problems
from cadenza.kernels.native import loader
from cadenza.version import __version__

log = logging.getLogger(__name__)

CALIBRATION_FORMAT = 14  # part of the cache key: bump when the measurement changes


def calibration_identity(engine: Engine, seed: int, neighbours: int = 0) -> str:
    """The cache key: a hash of everything that changes what a step costs, the replicas
    measuring beside this one included."""
    config = engine.config
    parts = {
        "format": CALIBRATION_FORMAT,
        "neighbours": neighbours,
        "weights": list(engine.identity_keys),  # model, dtype, KV dtype, weights dtype
        "seed": seed,
        "device": device_name(engine.model.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cadenza": __version__,
        "chunk_frames": engine.frames.chunk_frames,
        "first_chunk_frames": engine.frames.first_chunk_frames,
        "pack_cpu_weights": config.cpu.pack_weights,
        "fused_cpu_decode": config.cpu.fused_decode,
        "native_kernels": native_kernels_key(),
        "batch_sizes": list(config.calibration.batch_sizes),
        "steps": engine.frames.calibration_steps,
        "long_context": config.calibration.long_context_tokens,
        # As configured (unset on CUDA it follows the free memory of the moment).
        "max_num_seqs": config.engine.max_num_seqs,
        "max_num_batched_tokens": config.engine.max_num_batched_tokens,
        "headroom": config.realtime.headroom,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def native_kernels_key() -> list[list[str]]:
    """Every native kernel library as the engine runs it: its source's hash, whether it
    loaded, for which level and ISA (a calibration made with the kernels on is not one of an
    engine running without them, or built for another instruction set)."""
    return [
        [k.library, loader.source_digest(k.library), k.status, k.level, k.isa]
        for k in loader.report()
    ]


def cache_path(engine: Engine, identity: str) -> Path:
    """Where the calibration of ``identity`` is cached (``calibration.cache_dir``)."""
    root = engine.config.calibration.cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cadenza"
    )
    return Path(root) / f"calibration-{identity}.json"


def read_cache(path: Path, tolerance: float) -> Calibration | None:
    """The cached calibration at ``path`` (``None``: unreadable, or one that contradicts
    itself, which a start then measures again)."""
    try:
        cached = replace(CALIBRATION_ADAPTER.validate_json(path.read_bytes()), source="cache")
    except (OSError, ValidationError) as exc:
        log.warning("ignoring unreadable calibration cache %s: %s", path, exc)
        return None
    problems = calibration_problems(cached, tolerance)
    if problems:
        log.warning(
            "ignoring a cached calibration that contradicts itself (%s)", "; ".join(problems)
        )
        return None
    return cached


def write_cache(path: Path, calibration: Calibration) -> None:
    """Store ``calibration`` at ``path`` (atomically; a failure is logged, not raised)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(CALIBRATION_ADAPTER.dump_json(calibration, indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot cache the calibration at %s: %s", path, exc)
