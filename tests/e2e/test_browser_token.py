"""The browser page holds a client token, not a key: an app server mints one and hands it over
in the address's fragment; the page lists the models and plays with it, and wipes it from the
address bar. Without it, the keyed server refuses the page by name."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tests.e2e.test_browser_client import ARGS, CHROMIUM, _wait
from tests.integration.server import serving

KEY = "app-server-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("browser-token")
    (directory / "keys").write_text(f"{KEY}\n")
    env = {
        "CADENZA_AUTH__API_KEYS_FILE": str(directory / "keys"),
        "CADENZA_AUTH__TOKEN_SECRET": "browser-token-test-secret-of-40-chars...",
    }
    with serving(directory / "server.log", env) as running:
        yield running


@pytest.mark.browser
def test_the_page_streams_with_a_minted_token_and_never_a_key(server):
    minted = httpx.post(
        f"{server.url}/v1/client_tokens",
        json={"ttl_s": 120, "models": ["cadenza-tiny"]},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    token = minted.json()["token"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{server.url}/#token={token}")
            _wait(lambda: page.eval_on_selector_all("#model option", "o => o.length") > 0, 10,
                  "the models, listed with the token")  # fmt: skip
            assert "token" not in page.url  # wiped from the address bar
            page.fill("#text", "x" * 28)
            page.click("#speak")
            _wait(lambda: page.text_content("#status") in ("playing", "done"), 30, "playback")
            assert page.text_content("#error") == ""

            bare = browser.new_page()  # no token: the keyed server refuses the offer by name
            bare.goto(server.url)
            bare.fill("#text", "x" * 28)
            bare.click("#speak")
            _wait(lambda: "invalid_api_key" in (bare.text_content("#error") or ""), 30,
                  "the refusal")  # fmt: skip
        finally:
            browser.close()
