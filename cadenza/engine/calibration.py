"""Start-up calibration: measure what a step costs on this device, fit a :class:`StepTimeModel`.

The sweep runs the real engine on synthetic streams, so the measurement includes everything a
live step does: the forward pass, sampling, and the streaming codec decode amortised over the
chunk. For each batch size ``B`` (``engine.calibration_batch_sizes``, up to ``max_num_seqs`` and
the KV pages available): start ``B`` streams with short prompts, their arrivals spread over
one chunk period as live arrivals are (so their codec decodes fall on different steps), step
until every one has
delivered its first chunk, then time ``engine.calibration_steps`` pure decode steps in windows
of one chunk period (each window holds one codec decode per stream) and record the median of
the window means, which shrugs off a burst of noise from a neighbour on a shared machine.
The sweep stops once a point is more than twice the real-time step budget (larger batches
cannot be admitted anyway). One more point decodes a smaller batch at a long context
(``engine.calibration_long_context`` prompt tokens) so attention's share is measured too.
The points become a :class:`StepTimeModel` (:meth:`StepTimeModel.fit`).

The result is cached as JSON under ``engine.calibration_cache_dir`` keyed by everything that
changes step time: model, seed, dtype, device name, threads, torch and cadenza versions, and
the engine settings involved. ``calibration = "refresh"`` measures again; ``"off"`` skips it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import secrets
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cadenza import __version__
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams
from cadenza.engine.step_time_model import StepSample, StepTimeModel

if TYPE_CHECKING:
    from cadenza.engine.engine import Engine

log = logging.getLogger(__name__)

_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    """A fitted step-time model and the points it came from."""

    model: StepTimeModel
    samples: tuple[StepSample, ...]
    codec_ms_per_frame: float  # streaming decode time per stream-frame at the largest batch
    device_name: str
    identity: str  # the cache key
    measured_s: float  # how long the sweep took
    source: str = "measured"  # or "cache"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT_VERSION,
            "model": self.model.to_dict(),
            "samples": [[s.tokens, s.context_tokens, s.ms] for s in self.samples],
            "codec_ms_per_frame": self.codec_ms_per_frame,
            "device_name": self.device_name,
            "identity": self.identity,
            "measured_s": self.measured_s,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        if data.get("format") != _FORMAT_VERSION:
            raise ValueError("unknown calibration format")
        return cls(
            model=StepTimeModel.from_dict(data["model"]),
            samples=tuple(StepSample(int(t), int(c), float(ms)) for t, c, ms in data["samples"]),
            codec_ms_per_frame=float(data["codec_ms_per_frame"]),
            device_name=str(data["device_name"]),
            identity=str(data["identity"]),
            measured_s=float(data["measured_s"]),
            source=str(data.get("source", "measured")),
        )


def device_name(device: torch.device) -> str:
    """A human-readable name of the device that runs the steps (the CPU model on CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def calibration_identity(engine: Engine, seed: int) -> str:
    """The cache key: a hash of everything that changes what a step costs."""
    config = engine.config
    parts = {
        "model": engine.model_name,
        "seed": seed,
        "dtype": str(engine.model.dtype),
        "kv_dtype": str(engine.kv_dtype),
        "weights_dtype": engine.weights_dtype,
        "device": device_name(engine.model.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cadenza": __version__,
        "chunk_frames": config.chunk_frames,
        "first_chunk_frames": config.first_chunk_frames,
        "pack_cpu_weights": config.pack_cpu_weights,
        "batch_sizes": list(config.calibration_batch_sizes),
        "steps": config.calibration_steps,
        "long_context": config.calibration_long_context,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "headroom": config.realtime_headroom,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def cache_path(engine: Engine, identity: str) -> Path:
    root = engine.config.calibration_cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cadenza"
    )
    return Path(root) / f"calibration-{identity}.json"


def load_or_calibrate(engine: Engine, seed: int = 0) -> Calibration | None:
    """Apply the configured calibration to ``engine`` (sets its step model) and return it;
    ``None`` when calibration is off or the model produces no audio."""
    mode = engine.config.calibration
    if mode == "off" or engine.policy is None:
        return None
    identity = calibration_identity(engine, seed)
    path = cache_path(engine, identity)
    calibration: Calibration | None = None
    if mode == "auto" and path.is_file():
        try:
            calibration = Calibration.from_dict(json.loads(path.read_text()))
            calibration = Calibration(**{**calibration.__dict__, "source": "cache"})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable calibration cache %s: %s", path, exc)
    if calibration is None:
        calibration = run_sweep(engine, identity)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(calibration.to_dict(), indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.warning("cannot cache the calibration at %s: %s", path, exc)
    engine.step_model = calibration.model
    log.info(
        "step time (%s, %s): %s; %.3f ms per 1k context; codec %.3f ms per frame",
        calibration.source,
        calibration.device_name,
        ", ".join(f"{t} streams {ms:.2f} ms" for t, _, ms in calibration.model.decode_points),
        calibration.model.per_kilocontext_ms,
        calibration.codec_ms_per_frame,
    )
    return calibration


def run_sweep(engine: Engine, identity: str = "") -> Calibration:
    """Measure step times on ``engine`` (which must be idle) and fit a model. The engine is
    idle again afterwards; its prefix cache may hold the synthetic prompts."""
    if engine.has_unfinished_requests():
        raise RuntimeError("calibration needs an idle engine")
    config = engine.config
    started = time.perf_counter()
    budget_ms = 1000.0 * (engine.policy.step_budget_s if engine.policy else math.inf)
    samples: list[StepSample] = []
    codec_ms = 0.0
    largest = 0
    for batch in sorted(set(config.calibration_batch_sizes)):
        if batch > config.max_num_seqs or not _fits(engine, batch, 32):
            break
        sample, codec_ms_batch = _measure(engine, batch, 32)
        samples.append(sample)
        if batch >= largest:
            largest, codec_ms = batch, codec_ms_batch
        if sample.ms > 2 * budget_ms and len(samples) >= 2:
            break
    long_sample = None
    if config.calibration_long_context > 0 and samples:
        batch = max(1, min(8, largest))
        if _fits(engine, batch, config.calibration_long_context):
            long_sample, _ = _measure(engine, batch, config.calibration_long_context)
    model = StepTimeModel.fit(samples, long_sample)
    if long_sample is not None:
        samples.append(long_sample)
    return Calibration(
        model=model,
        samples=tuple(samples),
        codec_ms_per_frame=codec_ms,
        device_name=device_name(engine.model.device),
        identity=identity,
        measured_s=time.perf_counter() - started,
    )


def _steps_needed(engine: Engine) -> int:
    config = engine.config
    return engine.layout.steps_for_frames(config.first_chunk_frames) + config.calibration_steps + 2


def _request(engine: Engine, prompt_chars: int) -> SynthesisRequest:
    frames = _steps_needed(engine) // engine.steps_per_frame + 2 * engine.config.chunk_frames + 8
    text = ("calibrate " * (prompt_chars // 10 + 1))[:prompt_chars]
    return SynthesisRequest(
        request_id=f"calibration-{secrets.token_hex(6)}",
        text=text,
        voice=engine.voices[0],
        max_duration_s=frames / engine.frame_rate,
        sampling=SamplingParams(seed=0),
    )


def _fits(engine: Engine, batch: int, prompt_chars: int) -> bool:
    """Whether ``batch`` synthetic streams fit in the KV cache and the engine's limits."""
    if batch > engine.config.max_pending_requests:
        return False
    if prompt_chars > engine.limits.max_input_chars:
        return False
    tokens = prompt_chars + 16 + _steps_needed(engine) + engine.config.chunk_frames * 16
    pages = batch * math.ceil(tokens / engine.config.block_size)
    return pages <= engine.block_pool.num_blocks


def _measure(engine: Engine, batch: int, prompt_chars: int) -> tuple[StepSample, float]:
    """Mean time of pure decode steps with ``batch`` streams; and codec ms per stream-frame."""
    requests = [_request(engine, prompt_chars) for _ in range(batch)]
    window = engine.config.chunk_frames * engine.steps_per_frame
    try:
        # Arrivals spread over one chunk period, as live streams arrive: their codec decodes
        # then fall on different steps, as they do in service.
        groups = [requests[i::window] for i in range(min(window, batch))]
        for group in groups:
            for request in group:
                engine.add_request(request)
            engine.step()
        seqs = [engine.sequence(r.request_id) for r in requests]
        for _ in range(_steps_needed(engine) * 4):
            engine.step()
            if all(seq is None or seq.frames_sent > 0 for seq in seqs):
                break
        window_means, contexts = [], []
        codec_s, codec_frames = engine.codec_seconds, engine.codec_frames
        for _ in range(max(engine.config.calibration_steps // window, 1)):
            times = []
            for _ in range(window):
                engine.step()
                stats = engine.stats()
                if stats.last_batch_decodes == batch and stats.last_batch_tokens == batch:
                    times.append(1000.0 * engine.last_step_s)
                    contexts.append(stats.last_batch_context)
            if times:
                window_means.append(sum(times) / len(times))
        if not window_means:
            raise RuntimeError(f"calibration at batch {batch} produced no pure decode steps")
        frames = engine.codec_frames - codec_frames
        codec_ms = 1000.0 * (engine.codec_seconds - codec_s) / frames if frames else 0.0
        sample = StepSample(
            tokens=batch,
            context_tokens=round(sum(contexts) / len(contexts)),
            ms=statistics.median(window_means),
        )
        log.debug("calibration point: %s", sample)
        return sample, codec_ms
    finally:
        for request in requests:
            engine.abort_request(request.request_id)
        engine.step()  # delivers (and drops) the cancellations
        engine.chunk_slacks_s.clear()
