"""The keys of the previous release, read for one more release with a warning.

Until this release every engine-process setting sat in ``[engine]``, with chunk sizes and the
calibration's length counted in 75 Hz frames. Those keys now live with their owners
(``supervision``, ``realtime``, ``cpu``, ``calibration``) and durations are milliseconds.
``server.api_keys_file`` moved to ``[auth]`` with the other keys of who may connect.
An old key still works: :func:`move_old_keys` reads it as its new key, converting 75 Hz
frames to milliseconds (``n`` frames are ``n × 1000 / 75`` ms, which a 75 Hz codec counts as
``n`` frames again; ``resume_replay_frames``, which counted the codec's own frames, is read
at 75 Hz too), and logs once per key which key to use instead. An old key counts where
its source counts (a flag beats the environment beats the file, whatever the key's age); given
together with its new key in the same source, the new key wins and the old one is ignored,
with a warning.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, get_origin

from pydantic import BaseModel

from cadenza.config.section import ConfigError
from cadenza.config.sources import ORIGIN_NAMES, Origin, spelled
from cadenza.config.tree import CadenzaConfig

log = logging.getLogger(__name__)

LEGACY_FRAME_RATE = 75.0
"""What the old ``*_frames`` keys counted in (EnCodec 24 kHz frames)."""


@dataclass(frozen=True)
class OldKey:
    """A key of the previous release (``section.key``) and the key that replaced it."""

    old: str
    new: str
    frames_to_ms: bool = False  # the old key counted 75 Hz frames; the new one milliseconds


OLD_KEYS: dict[str, OldKey] = {
    key.old: key
    for key in (
        OldKey("engine.mode", "supervision.mode"),
        OldKey("engine.startup_timeout_s", "supervision.startup_timeout_s"),
        OldKey("engine.replicas", "supervision.replicas"),
        OldKey("engine.warm_spare", "supervision.warm_spare"),
        OldKey("engine.heartbeat_timeout_s", "supervision.heartbeat_timeout_s"),
        OldKey("engine.restart_backoff_s", "supervision.restart_backoff_s"),
        OldKey("engine.restart_backoff_max_s", "supervision.restart_backoff_max_s"),
        OldKey("engine.max_start_failures", "supervision.max_start_failures"),
        OldKey("engine.resume_replay_frames", "supervision.resume_replay_ms", frames_to_ms=True),
        OldKey("engine.chunk_frames", "realtime.chunk_ms", frames_to_ms=True),
        OldKey("engine.first_chunk_frames", "realtime.first_chunk_ms", frames_to_ms=True),
        OldKey("engine.ttfa_target_ms", "realtime.ttfa_target_ms"),
        OldKey("engine.playout_reserve_ms", "realtime.playout_reserve_ms"),
        OldKey("engine.prompt_ttfa_multiple", "realtime.prompt_ttfa_multiple"),
        OldKey("engine.max_lead_ms", "realtime.max_lead_ms"),
        OldKey("engine.lead_hysteresis_ms", "realtime.lead_hysteresis_ms"),
        OldKey("engine.realtime_headroom", "realtime.headroom"),
        OldKey("engine.pack_cpu_weights", "cpu.pack_weights"),
        OldKey("engine.cpu_linear_dtype", "cpu.linear_dtype"),
        OldKey("engine.fused_cpu_decode", "cpu.fused_decode"),
        OldKey("engine.codec_dtype", "cpu.codec_dtype"),
        OldKey("engine.calibration", "calibration.mode"),
        OldKey("engine.calibration_batch_sizes", "calibration.batch_sizes"),
        OldKey("engine.calibration_steps", "calibration.duration_ms", frames_to_ms=True),
        OldKey("engine.calibration_long_context", "calibration.long_context_tokens"),
        OldKey("engine.calibration_attempts", "calibration.attempts"),
        OldKey("engine.calibration_tolerance", "calibration.tolerance"),
        OldKey("engine.calibration_cache_dir", "calibration.cache_dir"),
        OldKey("server.api_keys_file", "auth.api_keys_file"),
    )
}

_warned: set[str] = set()


def warn_deprecated(what: str, old: str, new: str, detail: str = "") -> None:
    """Log, once per ``old`` in this process, that the deprecated ``what`` ``old`` is read as
    ``new`` (``detail``: how its value was converted)."""
    if old in _warned:
        return
    _warned.add(old)
    log.warning(
        "deprecated %s: %s is read as %s%s in this release only, and refused after it; use %s",
        what,
        old,
        new,
        f" ({detail})" if detail else "",
        new,
    )


def move_old_keys(
    values: dict[str, Any], origin: Origin, moved: dict[str, str] | None = None
) -> dict[str, Any]:
    """``values`` (one source's nested dict) with every old key read as its new key.

    ``moved`` collects, for each new key filled from an old one, how ``origin`` spelled the
    old key (validation errors name it). Raises :class:`ConfigError` for an old frame count
    that is not a number."""
    sections = [
        name
        for name, section in values.items()
        if isinstance(section, dict) and any(f"{name}.{k}" in OLD_KEYS for k in section)
    ]
    if not sections:
        return values
    result = {name: dict(v) if isinstance(v, dict) else v for name, v in values.items()}
    for section_name in sections:
        _move_section(result, section_name, origin, moved)
    return result


def _move_section(
    result: dict[str, Any], section_name: str, origin: Origin, moved: dict[str, str] | None
) -> None:
    """Move the old keys of ``result[section_name]`` to their new keys, in place."""
    for name in list(result[section_name]):
        old_key = OLD_KEYS.get(f"{section_name}.{name}")
        if old_key is None:
            continue
        value = result[section_name].pop(name)
        old, new = spelled(old_key.old, origin), spelled(old_key.new, origin)
        section, key = old_key.new.split(".")
        target = result.setdefault(section, {})
        if not isinstance(target, dict) or key in target:  # the new key given too: it wins
            if f"{old_key.old}+" not in _warned:
                _warned.add(f"{old_key.old}+")
                log.warning(
                    "%s sets both %s and %s: %s is used, the deprecated %s ignored",
                    ORIGIN_NAMES[origin],
                    old,
                    new,
                    new,
                    old,
                )
            continue
        detail = ""
        if old_key.frames_to_ms:
            frames = _number(value, _given_as(old_key, origin))
            value = frames * 1000.0 / LEGACY_FRAME_RATE
            detail = f"{frames:g} frames at {LEGACY_FRAME_RATE:g} Hz = {value:g} ms"
        elif origin == "environment" and isinstance(value, str) and _is_sequence(old_key.new):
            value = _json_or_text(value)
        warn_deprecated(f"configuration key in {ORIGIN_NAMES[origin]}", old, new, detail)
        target[key] = value
        if moved is not None:
            moved[old_key.new] = _given_as(old_key, origin)
    if not result[section_name]:
        del result[section_name]


def _given_as(old_key: OldKey, origin: Origin) -> str:
    """``engine.chunk_frames, given as CADENZA_ENGINE__CHUNK_FRAMES in the environment``."""
    old = spelled(old_key.old, origin)
    as_spelled = "" if old == old_key.old else f", given as {old}"
    return f"{old_key.old}{as_spelled} in {ORIGIN_NAMES[origin]}"


def _number(value: Any, given_as: str) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"invalid configuration: {given_as}: a number of {LEGACY_FRAME_RATE:g} Hz frames "
            f"is expected, got {value!r}"
        ) from None


def _is_sequence(key: str) -> bool:
    section, name = key.split(".")
    section_type = CadenzaConfig.model_fields[section].annotation
    assert isinstance(section_type, type) and issubclass(section_type, BaseModel)
    return get_origin(section_type.model_fields[name].annotation) in (tuple, list)


def _json_or_text(value: str) -> Any:
    """An environment value for a sequence key, decoded as the environment's new keys are."""
    try:
        return json.loads(value)
    except ValueError:
        return value  # validation says what is wrong with it
