"""A pluggable guard on input text, run before a request reaches the engine.

A guard is any object with ``name`` and ``async check(text) -> GuardVerdict``. The server runs
it under a timeout; if it times out or raises, the configured fallback decides, the same way
every time: ``fail_open`` allows the request, otherwise it is refused. Every decision is written
as one audit log line (JSON, logger ``cadenza.audit``) with the verdict, the policy, the time it
took and a SHA-256 of the text (never the text itself).

Policies: ``none``; ``phrase_list`` (the example: refuse text containing any phrase of a file,
case-insensitively, on word boundaries); or ``python:package.module:factory``, a callable that
takes the :class:`GuardConfig` and returns a guard.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cadenza.config import GuardConfig

audit = logging.getLogger("cadenza.audit")


@dataclass(frozen=True)
class GuardVerdict:
    allowed: bool
    reason: str | None = None


class TextGuard(Protocol):
    name: str

    async def check(self, text: str) -> GuardVerdict: ...


class GuardError(ValueError):
    """The guard configuration cannot be used (bad policy, unreadable phrase file)."""


class PhraseListGuard:
    """Refuses text that contains any listed phrase (one per line; ``#`` comments)."""

    name = "phrase_list"

    def __init__(self, phrases: list[str]) -> None:
        cleaned = [" ".join(p.split()) for p in phrases if p.strip() and not p.startswith("#")]
        if not cleaned:
            raise GuardError("the phrase list is empty")
        alternatives = "|".join(re.escape(p) for p in cleaned)
        self._pattern = re.compile(rf"\b(?:{alternatives})\b", re.IGNORECASE)

    @classmethod
    def from_file(cls, path: str | Path) -> PhraseListGuard:
        try:
            return cls(Path(path).read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise GuardError(f"cannot read phrase list {path}: {exc}") from exc

    async def check(self, text: str) -> GuardVerdict:
        match = self._pattern.search(" ".join(text.split()))
        return (
            GuardVerdict(False, "text contains a refused phrase") if match else GuardVerdict(True)
        )


def build_guard(config: GuardConfig) -> TextGuard | None:
    """The configured guard, or ``None`` for ``policy = "none"``. Raises :class:`GuardError`."""
    if config.policy == "none":
        return None
    if config.policy == "phrase_list":
        if not config.phrases_file:
            raise GuardError("guard.policy phrase_list needs guard.phrases_file")
        return PhraseListGuard.from_file(config.phrases_file)
    if config.policy.startswith("python:"):
        module_name, _, attribute = config.policy.removeprefix("python:").partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise GuardError(f"cannot load guard {config.policy!r}: {exc}") from exc
        guard: TextGuard = factory(config)
        return guard
    raise GuardError(f"unknown guard policy {config.policy!r}")


async def run_guard(
    guard: TextGuard | None, text: str, config: GuardConfig, client: str
) -> GuardVerdict:
    """Check ``text``; timeouts and errors fall back to ``config.fail_open``. Audited."""
    if guard is None:
        return GuardVerdict(True)
    started = time.perf_counter()
    policy = guard.name
    try:
        verdict = await asyncio.wait_for(guard.check(text), config.timeout_s)
    except TimeoutError:
        verdict, policy = GuardVerdict(config.fail_open, "guard timed out"), "fallback"
    except Exception as exc:  # a broken guard must not take the request path down
        verdict, policy = GuardVerdict(config.fail_open, f"guard failed: {exc}"), "fallback"
    audit.info(
        json.dumps(
            {
                "event": "guard",
                "client": client,
                "allowed": verdict.allowed,
                "reason": verdict.reason,
                "policy": policy,
                "ms": round(1000 * (time.perf_counter() - started), 2),
                "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
            }
        )
    )
    return verdict
