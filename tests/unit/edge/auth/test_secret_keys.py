"""Keys derived from the token secret: the same on every node, one per purpose."""

from __future__ import annotations

from cadenza.edge.auth.secret_keys import derived_key


def test_each_purpose_has_its_own_key_and_every_node_derives_it() -> None:
    secret = "x" * 40
    tokens, checkpoints = derived_key(secret, "client-tokens"), derived_key(secret, "checkpoints")
    assert len(tokens) == len(checkpoints) == 32 and tokens != checkpoints
    assert derived_key(secret, "client-tokens") == tokens
    assert derived_key("y" * 40, "client-tokens") != tokens
    assert secret.encode() not in tokens
