"""Modules the edge's web stack imports the first time a request needs them, imported at start-up
instead.

A first import reads and executes a module on the event loop: a stall for every stream the edge
carries. anyio loads its asyncio backend the first time a request checks whether its client
left (``Request.is_disconnected``, every HTTP speech request): on a fresh install that import
held the loop for 397 ms while a three-times overload ran, and an admitted WebSocket stream
heard the gap (the loop watch named it: :mod:`cadenza.loop_lag`). The edge imports these before
it takes its first request.
"""

from __future__ import annotations

import importlib

LAZY_MODULES = ("anyio._backends._asyncio",)


def import_lazy_modules() -> None:
    """Import every module of :data:`LAZY_MODULES` now (a no-op for those already loaded)."""
    for name in LAZY_MODULES:
        importlib.import_module(name)
