"""Every error code the server can send (HTTP error bodies, WebSocket and data-channel ``error``
messages) is documented in docs/protocol.md.

The codes have no registry: each is written where its refusal is raised. So they are collected
from the edge's source as a reader finds them: every string given as an error's code (a call's
``code=``, the first argument of the error types and messages that take the code first, what a
``code = ...`` line can assign), plus the two families made at run time: the engine's codes as
:meth:`EdgeError.from_engine` names them, and the refusals the checkpoint store's Redis script
answers a ``resume`` with."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

from cadenza.contract.errors import EngineError, EngineErrorCode
from cadenza.edge.streams import checkpoints
from cadenza.edge.streams.errors import EdgeError

ROOT = Path(__file__).resolve().parents[3]
EDGE = ROOT / "cadenza" / "edge"
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"

# Calls whose first argument is the code (``_drop`` is the WebSocket's last error before 4001).
CODE_FIRST = {"ProtocolError", "error_message", "AdmissionRefused", "ResumeRefused", "_drop"}
CODE_SECOND = {"_goodbye"}  # the WebSocket's last error: close code, then the error code

NOT_SENT = {  # codes in the edge's source that no client ever reads, and why
    "client_closed": "the 499 of a request whose client hung up: for the metrics and the log",
    "invalid_audio_frame": "the SDK's check of the server's binary frames (decode_audio_frame)",
}


def _strings(expr: ast.expr | None) -> set[str]:
    """The strings ``expr`` can evaluate to: a literal, either branch of ``a if c else b``, the
    values (and the default) of ``{...}.get(key, default)``; nothing for a name or a call."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _strings(expr.body) | _strings(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return set().union(*(_strings(value) for value in expr.values))
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "get"
        and isinstance(expr.func.value, ast.Dict)
    ):
        values = {s for value in expr.func.value.values for s in _strings(value)}
        return values | (_strings(expr.args[1]) if len(expr.args) > 1 else set())
    return set()


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def codes_in_source(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            callee = _callee(node)
            found |= {s for kw in node.keywords if kw.arg == "code" for s in _strings(kw.value)}
            if callee in CODE_FIRST and node.args:
                found |= _strings(node.args[0])
            if callee in CODE_SECOND and len(node.args) > 1:
                found |= _strings(node.args[1])
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "code" for target in node.targets
        ):
            found |= _strings(node.value)
    return found


def codes_sent() -> set[str]:
    from_source = {code for path in EDGE.rglob("*.py") for code in codes_in_source(path)}
    engine = {
        EdgeError.from_engine(EngineError("", code)).code for code in get_args(EngineErrorCode)
    }
    resume_refusals = set(checkpoints._REFUSALS)  # the Redis script answers with its keys
    return (from_source | engine | resume_refusals) - set(NOT_SENT)


def documented_codes() -> set[str]:
    return set(re.findall(r"`([a-z][a-z0-9_]*)`", PROTOCOL_DOC.read_text()))


def test_every_error_code_the_server_sends_is_in_the_protocol_doc() -> None:
    missing = sorted(codes_sent() - documented_codes())
    assert not missing, f"error codes docs/protocol.md does not list: {missing}"


def test_the_collection_finds_each_kind_of_code() -> None:
    """A collector that found nothing would pass the test above: it must find one code of
    each way codes are written, and the codes it leaves out must still exist."""
    sent = codes_sent()
    assert {
        "invalid_json",  # ProtocolError("invalid_json", ...)
        "model_not_found",  # InvalidRequest(..., code="model_not_found")
        "queue_full",  # AdmissionRefused("queue_full", ...)
        "method_not_allowed",  # code = {404: ..., 405: "method_not_allowed"}.get(...)
        "unknown_field",  # code = "unknown_field" if ... else "invalid_value"
        "unexpected_binary",  # protocol.error_message("unexpected_binary", ...)
        "engine_rejected",  # EdgeError.from_engine
        "resume_taken",  # the Redis script's answer
    } <= sent
    everything = {code for path in EDGE.rglob("*.py") for code in codes_in_source(path)}
    assert set(NOT_SENT) <= everything
