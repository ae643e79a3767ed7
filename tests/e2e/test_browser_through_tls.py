"""The browser page through the front door over HTTPS: HAProxy terminates TLS with a
self-signed certificate (``cadenza haproxy-config --tls-cert``), the page loads in a secure
context (where browsers allow the microphone and WebRTC away from localhost), signals its
WebRTC offer through HAProxy, and plays the node's audio."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import sync_playwright

from cadenza.cluster.haproxy_config import FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import parse_address, parse_node
from tests.e2e.test_browser_client import ARGS, CHROMIUM, INBOUND_AUDIO
from tests.integration.server import serving
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port
from tests.support.self_signed import self_signed_pem


@pytest.mark.browser
def test_the_page_plays_through_https_at_the_front_door(tmp_path) -> None:
    agent = free_port()
    with serving(tmp_path / "node.log", args=("--agent-port", str(agent))) as node:
        port = free_port()
        door = FrontDoor(
            listen=parse_address(f"127.0.0.1:{port}", "--listen"),
            nodes=(parse_node(f"127.0.0.1:{node.port}:{agent}"),),
            tls_cert_pem=str(self_signed_pem(tmp_path / "front.pem")),
        )
        with running_haproxy(render_haproxy_config(door), tmp_path, [port]):
            time.sleep(2.5)  # the first health check and agent check
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=ARGS
                )
                try:
                    page = browser.new_page(ignore_https_errors=True)
                    page.goto(f"https://localhost:{port}/")
                    assert page.evaluate("window.isSecureContext") is True
                    page.fill("#text", "x" * 120)
                    page.click("#speak")
                    deadline = time.monotonic() + 30
                    while (page.evaluate(INBOUND_AUDIO) or {"samples": 0})["samples"] < 24000:
                        assert time.monotonic() < deadline, page.text_content("#error")
                        time.sleep(0.1)
                    assert page.text_content("#error") == ""
                finally:
                    browser.close()
