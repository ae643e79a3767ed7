"""``[guard]``: the input-text guard (``edge/admission/guard.py``)."""

from __future__ import annotations

from pydantic import Field

from cadenza.config.section import Section


class GuardConfig(Section):
    """The input-text guard (see ``admission/guard.py``)."""

    policy: str = Field(
        "none", description="none, phrase_list, or python:module:factory (a pluggable guard)"
    )
    phrases_file: str | None = Field(None, description="phrase_list: one refused phrase per line")
    timeout_s: float = Field(0.2, gt=0, description="how long the guard may take per request")
    fail_open: bool = Field(
        False, description="on guard timeout or error: allow (true) or refuse (false)"
    )
