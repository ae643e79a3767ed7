"""A node behind NAT announces the address its clients reach it at, in its host candidates."""

from __future__ import annotations

from cadenza.config import ServerConfig
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
    assert browser_ice_servers(server) == [turn, {"urls": ["stun:stun.example:3478"]}]
    configured = rtc_configuration(server).iceServers or []
    assert [s.urls for s in configured] == [turn["urls"], ["stun:stun.example:3478"]]


def test_garbage_ice_servers_are_named() -> None:
    import pytest

    from cadenza.config import ConfigError, load_config

    for garbage in ([{"urls": ["http://x"]}], [{"urls": []}], "nope", [{"urls": ["turn:h:0"]}]):
        with pytest.raises(ConfigError, match=r"server\.webrtc_ice_servers"):
            load_config(overrides={"server": {"webrtc_ice_servers": garbage}})
