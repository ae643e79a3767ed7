"""Operator routes: drain the server, restart a model's replicas one at a time, list replicas.

With admin keys (``auth.admin_keys_file``) they take only an admin key (403 for a stream key or
a client token); without them, only requests on this host's loopback interface that no proxy
forwarded and no web page sent, naming the host by a loopback name (``localhost``,
``127.0.0.1``, ``[::1]``: a page that rebinds its own name to 127.0.0.1 does not pass), judged
by the socket's own peer, never by ``X-Forwarded-For``
(:mod:`cadenza.edge.server.socket_peer`). Every front-door configuration shipped denies
``/admin`` from outside as well.

* ``POST /admin/drain``: what SIGTERM does (see :mod:`cadenza.edge.server.lifecycle`): no new
  streams, ``/readyz`` 503, open streams run on for up to ``server.drain_timeout_s``, then the
  process exits 0. Answers 202 at once.
* ``POST /admin/restart?model=NAME``: a rolling restart of the model's replicas (the default
  model without ``model``); each stops taking streams, its streams finish (or, past the drain
  timeout, resume on another replica), then it restarts; a replica that does not come back
  stops the rollout. Answers 202 at once (409 ``busy`` while one is under way); ``/readyz``
  and ``/admin/replicas`` show the progress.
* ``GET /admin/replicas``: every model's replicas: state, process id, last error, streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cadenza.edge.auth.api_keys import bearer_token
from cadenza.edge.server.socket_peer import socket_peer, was_forwarded
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import EdgeError

log = logging.getLogger(__name__)

router = APIRouter()


def exit_after_drain(request: Request) -> Callable[[], None] | None:
    """What the server runs once a drain is over (set by the process that serves the app:
    make it exit); ``None`` under a test client."""
    return getattr(request.app.state, "exit_after_drain", None)


@router.post("/admin/drain", status_code=202)
async def drain(request: Request) -> JSONResponse:
    state = _authorize(request)
    timeout_s = state.config.server.drain_timeout_s
    on_drained = exit_after_drain(request)

    async def run() -> None:
        await state.lifecycle.drain(timeout_s)
        if on_drained is not None:
            on_drained()

    _background(state, run())
    body = {"status": "draining", "open_streams": state.lifecycle.open_streams}
    return JSONResponse(body | {"drain_timeout_s": timeout_s}, status_code=202)


@router.post("/admin/restart", status_code=202)
async def restart(request: Request, model: str | None = None) -> JSONResponse:
    state = _authorize(request)
    service = state.service(model)
    if service.restarting:
        raise EdgeError(409, f"a rolling restart of {service.name!r} is under way", code="busy")
    timeout_s = state.config.server.drain_timeout_s
    _background(state, service.rolling_restart(timeout_s))
    body = {"status": "restarting", "model": service.name, "replicas": len(service.replicas)}
    return JSONResponse(body, status_code=202)


@router.get("/admin/replicas")
async def replicas(request: Request) -> dict[str, Any]:
    state = _authorize(request)
    return {
        "models": {
            name: [
                {
                    "replica": r.index,
                    "status": r.status,
                    "pid": r.pid,
                    "streams": 0 if r.client is None else r.client.num_streams,
                    "spare": r.spare_status,
                    "last_error": r.last_error,
                }
                for r in service.replicas
            ]
            for name, service in state.services.items()
        }
    }


def _authorize(request: Request) -> EdgeState:
    state: EdgeState = request.app.state.edge
    state.auth.administrator(
        bearer_token(request.headers.get("authorization")),
        socket_peer(request.scope),
        was_forwarded(request.scope),
        host=request.headers.get("host"),
        origin=request.headers.get("origin"),
    )
    return state


def _background(state: EdgeState, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` after the response, keeping a reference until it is done."""
    task = asyncio.create_task(work)
    state.admin_tasks.add(task)

    def done(finished: asyncio.Task[None]) -> None:
        state.admin_tasks.discard(finished)
        if not finished.cancelled() and (exc := finished.exception()) is not None:
            log.error("admin task failed", exc_info=exc)

    task.add_done_callback(done)
