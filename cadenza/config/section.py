"""What every configuration section is: frozen plain data that refuses unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """The configuration (file, environment or flags) is invalid; the message says where."""


class Section(BaseModel):
    """One ``[section]`` of the tree: frozen, and a key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)
