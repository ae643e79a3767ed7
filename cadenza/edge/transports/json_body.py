"""An HTTP request's JSON body as a typed request, refused by name: one rule for every route
that takes a JSON object (the speech API, client tokens).

The bytes pass the edge's JSON policy (:mod:`~cadenza.edge.streams.untrusted_json`), must be
an object, and are validated against a pydantic model that forbids unknown fields. Refusals
are :class:`EdgeError` 400: ``invalid_json`` (not JSON under the policy, or not an object),
``unknown_field`` and ``invalid_value`` (``param``: the field, dotted for nested ones; the
message names it too). Only the first problem is told.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.untrusted_json import JsonRejected, parse_json

Body = TypeVar("Body", bound=BaseModel)


def parse_json_body(raw: bytes, model: type[Body], *, empty_is_object: bool = False) -> Body:
    """``raw`` as a ``model``; ``empty_is_object``: a body of nothing (or whitespace) is ``{}``
    (for routes whose every field is optional). Raises :class:`EdgeError`."""
    try:
        payload = {} if empty_is_object and not raw.strip() else parse_json(raw)
    except JsonRejected as exc:
        raise EdgeError(400, f"request body: {exc}", code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise EdgeError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        code = "unknown_field" if first["type"] == "extra_forbidden" else "invalid_value"
        raise EdgeError(400, message, code=code, param=param) from exc
