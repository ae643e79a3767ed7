"""TURN credentials that expire: the relay's formula (coturn's ``use-auth-secret``), an
expiry at most a day ahead, and garbage refused."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadenza.edge.transports.turn_credentials import MAX_TTL_S, turn_credential

NOW_S = 1_700_000_000.7


def test_the_credential_is_coturns_formula_for_a_fixed_time() -> None:
    issued = turn_credential("relay-secret", "key:3f2a9c01d4e5", NOW_S, 3600)
    assert issued.expires_at == 1_700_003_600
    assert issued.username == "1700003600:key:3f2a9c01d4e5"
    # coturn: base64(HMAC-SHA1(key = static-auth-secret, message = username)), computed here
    # independently (and by `openssl dgst -sha1 -hmac`, written down) so that a change shows
    expected = base64.b64encode(
        hmac.new(b"relay-secret", b"1700003600:key:3f2a9c01d4e5", hashlib.sha1).digest()
    ).decode()
    assert issued.credential == expected == "sGnPi5+Tg4YgkEhXW7jqVypSJkc="


def test_the_expiry_leads_the_username_as_coturn_reads_it() -> None:
    """coturn takes the digits before the first ':' as the expiry; the subject may hold ':'."""
    issued = turn_credential("s", "ip:2001:db8::1", NOW_S, 60)
    expiry, _, subject = issued.username.partition(":")
    assert int(expiry) == issued.expires_at and subject == "ip:2001:db8::1"


@given(ttl_s=st.integers(1, MAX_TTL_S), now_s=st.floats(0, 4e9))
def test_the_expiry_is_at_most_a_day_ahead(ttl_s: int, now_s: float) -> None:
    issued = turn_credential("s", "ip:127.0.0.1", now_s, ttl_s)
    assert now_s < issued.expires_at <= now_s + MAX_TTL_S
    assert MAX_TTL_S == 86400


@pytest.mark.parametrize("ttl_s", [0, -1, MAX_TTL_S + 1, 10**9])
def test_a_lifetime_outside_a_day_is_refused(ttl_s: int) -> None:
    with pytest.raises(ValueError, match="lives 1 to 86400 s"):
        turn_credential("s", "ip:127.0.0.1", NOW_S, ttl_s)


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        turn_credential("", "ip:127.0.0.1", NOW_S, 60)


def test_subjects_and_secrets_give_different_credentials() -> None:
    one = turn_credential("secret-one", "key:a", NOW_S, 60)
    assert turn_credential("secret-two", "key:a", NOW_S, 60).credential != one.credential
    assert turn_credential("secret-one", "key:b", NOW_S, 60).credential != one.credential
    assert "secret-one" not in one.username + one.credential
