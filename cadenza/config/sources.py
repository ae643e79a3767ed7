"""Where configuration values come from, and how each source spells a key: the environment
(``CADENZA_SECTION__KEY``), a TOML file (``[section] key``), flags (``section.key``)."""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic_settings import BaseSettings, EnvSettingsSource

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
    return source()
