"""The browser page keeps playing when its node dies: two nodes with stream checkpoints in
Redis behind HAProxy; mid-utterance the node serving the page is SIGKILLed (edge and
engines); the page notices its node fell silent, offers again through the front door, resumes
on the other node, shows the gap in its status, and the utterance ends ``done``."""

from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import sync_playwright

from cadenza.cluster.haproxy_config import render_haproxy_config
from tests.e2e.test_browser_client import ARGS, CHROMIUM, INBOUND_AUDIO
from tests.support.fleet import Fleet
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port
from tests.support.redis_process import running_redis


def _serving_node(fleet: Fleet) -> str:
    """The node with a stream open."""
    for name, node in fleet.nodes.items():
        if httpx.get(f"{node.url}/v1/capacity", timeout=5).json()["active"]:
            return name
    raise AssertionError("no node holds the page's stream")


def _wait_for(page, condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: {page.text_content('#status')!r} " + (
            page.text_content("#error") or ""
        )
        time.sleep(0.1)


@pytest.mark.browser
def test_the_page_resumes_on_another_node_when_its_node_dies(tmp_path) -> None:
    with running_redis(tmp_path) as redis:
        fleet = Fleet(tmp_path, redis.url)
        try:
            port = free_port()
            with running_haproxy(render_haproxy_config(fleet.door(port)), tmp_path, [port]):
                time.sleep(2.5)  # the first health checks and agent checks
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(
                        executable_path=CHROMIUM, headless=True, args=ARGS
                    )
                    try:
                        page = browser.new_page()
                        page.goto(f"http://localhost:{port}/")
                        page.fill("#text", "x" * 112)  # eight seconds
                        page.click("#speak")

                        def heard() -> int:
                            return (page.evaluate(INBOUND_AUDIO) or {"samples": 0})["samples"]

                        _wait_for(page, lambda: heard() > 24000, 30, "no audio")
                        fleet.nodes[_serving_node(fleet)].kill_group()
                        status = lambda: page.text_content("#status") or ""  # noqa: E731
                        _wait_for(page, lambda: "resumed" in status(), 30, "no resume")
                        _wait_for(page, lambda: status() == "done", 30, "not done")
                        assert page.text_content("#error") == ""
                        assert page.evaluate("window.cadenza.resumes") == 1
                    finally:
                        browser.close()
        finally:
            fleet.stop()
