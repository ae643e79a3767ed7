"""Building the configuration from its sources, and describing it.

Values come from, highest priority first: command-line flags, ``CADENZA_*`` environment
variables (nested keys joined with ``__``, e.g. ``CADENZA_SERVER__PORT=8001``), an optional TOML
file (``--config FILE``), then the defaults. Unknown keys are an error, so a typo in a file or
variable name never passes silently; the previous release's keys are still read, with a warning
(:mod:`cadenza.config.old_keys`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from cadenza.config.old_keys import move_old_keys
from cadenza.config.section import ConfigError
from cadenza.config.sources import environment_values, spelled
from cadenza.config.tree import CadenzaConfig


def load_config(
    config_file: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> CadenzaConfig:
    """Build the configuration: ``overrides`` (flags) > environment > ``config_file`` > defaults.

    ``overrides`` is a nested dict such as ``{"server": {"port": 8001}}``; ``None`` values are
    dropped so unset flags do not mask the environment. Raises :class:`ConfigError`.
    """
    file_values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    moved: dict[str, str] = {}
    merged = move_old_keys(file_values, "file", moved)
    merged = _deep_merge(merged, move_old_keys(environment_values(), "environment", moved))
    merged = _deep_merge(merged, move_old_keys(_drop_none(overrides or {}), "overrides", moved))
    try:
        return CadenzaConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, moved)) from exc


def config_reference() -> str:
    """Every configuration key with its environment variable, default and meaning (for --help)."""
    lines = []
    for section_name, section_field in CadenzaConfig.model_fields.items():
        if section_name == "models":
            lines.append(f"  [[models]] (config file only): {section_field.description}")
            continue
        section_type = section_field.annotation
        assert isinstance(section_type, type) and issubclass(section_type, BaseModel)
        for key, field in section_type.model_fields.items():
            dotted = f"{section_name}.{key}"
            lines.append(
                f"  {dotted} (env {spelled(dotted, 'environment')}, default "
                f"{field.default!r}): {field.description}"
            )
    return "\n".join(lines)


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            nested = _drop_none(value)
            if nested:
                cleaned[key] = nested
        elif value is not None:
            cleaned[key] = value
    return cleaned


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError, moved: dict[str, str]) -> str:
    """The problems, each at its key (and the deprecated key it was given as)."""
    problems = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "(root)"
        given_as = moved.get(".".join(str(part) for part in error["loc"][:2]))
        if given_as is not None:
            location = f"{location} ({given_as})"
        problems.append(f"{location}: {error['msg']}")
    return "invalid configuration: " + "; ".join(problems)
