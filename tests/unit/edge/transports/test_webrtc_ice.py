"""The ICE servers a node and a browser use (a relay's credentials made for each, expiring
where the relay has a secret), and a node behind NAT announcing the address its clients reach
it at in its host candidates."""

from __future__ import annotations

import json
import time

import pytest

from cadenza.config import ConfigError, ServerConfig, load_config
from cadenza.edge.transports.turn_credentials import turn_credential
from cadenza.edge.transports.webrtc_ice import (
    announce_address,
    browser_ice_servers,
    rtc_configuration,
)

ANSWER = "\r\n".join(
    [
        "v=0",
        "c=IN IP4 10.1.2.3",
        "a=candidate:1 1 udp 2130706431 10.1.2.3 50000 typ host",
        "a=candidate:2 1 udp 1694498815 203.0.113.9 50000 typ srflx raddr 10.1.2.3 rport 50000",
        "a=candidate:3 1 udp 16777215 198.51.100.7 49152 typ relay raddr 0.0.0.0 rport 0",
        "",
    ]
)


def test_host_candidates_and_connection_lines_name_the_public_address() -> None:
    announced = announce_address(ANSWER, "203.0.113.50")
    lines = announced.split("\r\n")
    assert lines[1] == "c=IN IP4 203.0.113.50"
    assert lines[2] == "a=candidate:1 1 udp 2130706431 203.0.113.50 50000 typ host"
    assert lines[3:5] == ANSWER.split("\r\n")[3:5]  # reflexive and relayed keep theirs
    assert announce_address(ANSWER, None) == ANSWER


def test_the_ice_servers_reach_both_the_node_and_the_browser() -> None:
    turn = {"urls": ["turn:relay.example:3478"], "username": "u", "credential": "p"}
    server = ServerConfig(webrtc_ice_servers=[turn, {"urls": ["stun:stun.example:3478"]}])
    assert browser_ice_servers(server, "ip:1.2.3.4") == [
        turn,
        {"urls": ["stun:stun.example:3478"]},
    ]
    configured = rtc_configuration(server).iceServers or []
    assert [s.urls for s in configured] == [turn["urls"], ["stun:stun.example:3478"]]
    assert (configured[0].username, configured[0].credential) == ("u", "p")


NOW_S = 1_700_000_000.0
SECRET = "shared-with-the-relay"


def test_a_relay_with_a_secret_gets_credentials_that_expire() -> None:
    server = ServerConfig(
        node_id="node-a",
        webrtc_ice_servers=[{"urls": ["turns:relay.example:5349"], "secret": SECRET}],
        turn_credential_ttl_s=600,
    )
    [browser] = browser_ice_servers(server, "key:3f2a9c01d4e5", NOW_S)
    expected = turn_credential(SECRET, "key:3f2a9c01d4e5", NOW_S, 600)
    assert browser == {
        "urls": ["turns:relay.example:5349"],
        "username": "1700000600:key:3f2a9c01d4e5",
        "credential": expected.credential,
    }
    [node] = rtc_configuration(server, NOW_S).iceServers or []
    assert node.username == "1700000600:node:node-a"
    assert node.credential == turn_credential(SECRET, "node:node-a", NOW_S, 600).credential
    assert SECRET not in json.dumps(browser) + repr(server)


def test_a_client_tokens_relay_credentials_expire_with_the_token() -> None:
    server = ServerConfig(webrtc_ice_servers=[{"urls": ["turn:r:3478"], "secret": SECRET}])
    [entry] = browser_ice_servers(server, "key:a", NOW_S, not_after=NOW_S + 300)
    assert entry["username"] == f"{int(NOW_S) + 300}:key:a"
    [later] = browser_ice_servers(server, "key:a", NOW_S, not_after=NOW_S + 7200)
    assert later["username"] == f"{int(NOW_S) + 3600}:key:a"  # the relay's own lifetime
    [spent] = browser_ice_servers(server, "key:a", NOW_S, not_after=NOW_S - 10)
    assert spent["username"] == f"{int(NOW_S) + 1}:key:a"


def test_the_default_lifetime_is_an_hour_and_never_over_a_day() -> None:
    server = ServerConfig(webrtc_ice_servers=[{"urls": ["turn:r:3478"], "secret": SECRET}])
    assert server.turn_credential_ttl_s == 3600
    [entry] = browser_ice_servers(server, "ip:1.2.3.4")
    expires_at = int(entry["username"].split(":")[0])
    assert time.time() < expires_at <= time.time() + 3600 + 1
    for garbage in (0, 59, 86401):
        with pytest.raises(ConfigError, match=r"server\.turn_credential_ttl_s"):
            load_config(overrides={"server": {"turn_credential_ttl_s": garbage}})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"urls": ["turn:r:3478"], "secret": "s", "username": "u", "credential": "p"},
            "not both",
        ),
        ({"urls": ["turn:r:3478"], "secret": "s", "username": "u"}, "not both"),
        ({"urls": ["turn:r:3478"], "secret": "s", "credential": "p"}, "not both"),
        ({"urls": ["stun:r:3478"], "secret": "s"}, "TURN servers only"),
        ({"urls": ["turn:r:3478", "stun:r:3478"], "secret": "s"}, "TURN servers only"),
        ({"urls": ["turn:r:3478"], "secret": ""}, "not blank"),
        ({"urls": ["turn:r:3478"], "secret": "   "}, "not blank"),
        ({"urls": ["turn:r:3478"], "secret": "x" * 257}, "1 to 256"),
        ({"urls": ["turn:r:3478"], "secret": 42}, "string"),
        ({"urls": ["turn:r:3478"], "secret": None, "secrets": "s"}, "secrets"),
    ],
)
def test_garbage_secrets_are_named(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"server\.webrtc_ice_servers") as caught:
        load_config(overrides={"server": {"webrtc_ice_servers": [entry]}})
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_rejected_entry_does_not_echo_its_secret() -> None:
    entry = {"urls": ["stun:r:3478"], "secret": "hunter2-do-not-print"}
    with pytest.raises(ConfigError) as caught:
        load_config(overrides={"server": {"webrtc_ice_servers": [entry]}})
    assert "hunter2" not in str(caught.value)


def test_garbage_ice_servers_are_named() -> None:
    garbage: object
    for garbage in ([{"urls": ["http://x"]}], [{"urls": []}], "nope", [{"urls": ["turn:h:0"]}]):
        with pytest.raises(ConfigError, match=r"server\.webrtc_ice_servers"):
            load_config(overrides={"server": {"webrtc_ice_servers": garbage}})
