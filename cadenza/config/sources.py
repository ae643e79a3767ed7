"""Where configuration values come from, and how each source spells a key: the environment
(``CADENZA_SECTION__KEY``), a TOML file (``[section] key``), flags (``section.key``)."""

from __future__ import annotations

import json
import os
from typing import Any, Literal, cast, get_origin

from pydantic import BaseModel
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsError

from cadenza.config.section import ConfigError
from cadenza.config.tree import CadenzaConfig

ENV_PREFIX = "CADENZA_"
ENV_NESTED_DELIMITER = "__"

Origin = Literal["file", "environment", "overrides"]
ORIGIN_NAMES: dict[Origin, str] = {
    "file": "the config file",
    "environment": "the environment",
    "overrides": "the flags",
}


def spelled(key: str, origin: Origin) -> str:
    """``section.key`` as ``origin`` spells it: ``CADENZA_SECTION__KEY`` in the environment,
    ``[section] key`` in a file, ``section.key`` otherwise."""
    section, name = key.split(".")
    if origin == "environment":
        return f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{name.upper()}"
    if origin == "file":
        return f"[{section}] {name}"
    return key


def environment_values() -> dict[str, Any]:
    """The ``CADENZA_*`` variables as a nested dict (``CADENZA_SERVER__PORT=8001``:
    ``{"server": {"port": "8001"}}``; JSON for the keys that hold lists), not yet validated."""
    source = EnvSettingsSource(
        # It reads only the fields of the class it is given, which need not be settings.
        cast(type[BaseSettings], CadenzaConfig),
        case_sensitive=False,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
    )
    try:
        return source()
    except SettingsError:
        raise ConfigError(_not_json()) from None


def _not_json() -> str:
    """Name the variable whose value the environment source could not parse: a key that holds
    a list or a table is read as JSON."""
    for variable, value in sorted(os.environ.items()):
        key = _json_key(variable)
        if key is not None:
            try:
                json.loads(value)
            except ValueError:
                return f"{variable} ({key}): {value!r} is not JSON (the key holds a list)"
    return "a CADENZA_* variable could not be read"


def _json_key(variable: str) -> str | None:
    """``section.key`` when ``variable`` sets a key whose value is read as JSON."""
    if not variable.upper().startswith(ENV_PREFIX):
        return None
    section, _, key = variable[len(ENV_PREFIX) :].lower().partition(ENV_NESTED_DELIMITER)
    section_field = CadenzaConfig.model_fields.get(section)
    section_type = section_field.annotation if section_field else None
    if not (isinstance(section_type, type) and issubclass(section_type, BaseModel)):
        return None
    field = section_type.model_fields.get(key)
    if field is None or get_origin(field.annotation) not in (list, dict):
        return None
    return f"{section}.{key}"
