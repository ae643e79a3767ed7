"""A JSON body as a typed request: garbage, other JSON values, unknown fields and bad values
are refused by name; an empty body is an empty object only where the route says so."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.transports.json_body import parse_json_body


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: float = Field(60.0, gt=0)
    names: list[str] | None = None


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"", "invalid_json", None),
        (b"{", "invalid_json", None),
        (b"[1]", "invalid_json", None),
        (b'"x"', "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        (b'{"ttl_s": NaN}', "invalid_json", None),
        (b'{"other": 1}', "unknown_field", "other"),
        (b'{"ttl_s": -1}', "invalid_value", "ttl_s"),
        (b'{"names": [1]}', "invalid_value", "names.0"),
    ],
)
def test_garbage_is_refused_by_name(raw: bytes, code: str, param: str | None) -> None:
    with pytest.raises(EdgeError) as refused:
        parse_json_body(raw, Body)
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, code, param)


def test_a_body_becomes_its_model() -> None:
    assert parse_json_body(b'{"ttl_s": 5, "names": ["a"]}', Body) == Body(ttl_s=5, names=["a"])
    assert parse_json_body(b" \n", Body, empty_is_object=True) == Body()
