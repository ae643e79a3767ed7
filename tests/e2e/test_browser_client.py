"""The browser page in headless Chromium (Debian's, driven by Playwright) against the server:
audio arrives and plays, the page shows time to first audio, Stop silences it at once."""

from __future__ import annotations

import contextlib
import shutil
import time

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from tests.integration.server import serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]

INBOUND_AUDIO = """async () => {
  if (!window.cadenza.pc) return null;
  const report = await window.cadenza.pc.getStats();
  let found = null;
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio")
      found = {samples: s.totalSamplesReceived || 0, level: s.audioLevel || 0};
  });
  return found;
}"""


SLOTS = 1  # the server holds one stream, so a test can fill it and watch the page queue


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"CADENZA_ENGINE__MAX_NUM_SEQS": str(SLOTS)}
    with serving(tmp_path_factory.mktemp("browser") / "server.log", env) as running:
        yield running


@pytest.fixture
def page(server):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(server.url)
            yield page
        finally:
            browser.close()


def _inbound(page: Page) -> dict[str, float]:
    return page.evaluate(INBOUND_AUDIO) or {"samples": 0, "level": 0}


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.browser
def test_the_page_offers_the_served_models_and_their_voices(page):
    _wait(lambda: page.eval_on_selector_all("#model option", "o => o.length") > 0, 10, "models")
    assert page.eval_on_selector_all("#model option", "o => o.map(x => x.value)") == [
        "cadenza-tiny"
    ]
    assert page.eval_on_selector_all("#voice option", "o => o.map(x => x.value)") == ["default"]


@pytest.mark.browser
def test_audio_plays_then_stop_silences_it(page):
    page.fill("#text", "x" * 400)
    page.click("#speak")
    _wait(lambda: page.text_content("#status") == "playing", 30, "playback to start")
    levels = []

    def loud():
        stats = _inbound(page)
        levels.append(stats["level"])
        return stats["samples"] > 24000 and max(levels) > 0.01

    _wait(loud, 20, "non-silent inbound audio")
    samples_before = _inbound(page)["samples"]
    _wait(lambda: _inbound(page)["samples"] > samples_before + 9600, 5, "samples to keep growing")
    _wait(lambda: page.text_content("#ttfa").endswith(" ms"), 10, "the page to show TTFA")
    page.click("#stop")
    _wait(lambda: page.text_content("#status") == "stopped", 10, "the stop to be confirmed")
    # Barge-in empties the server's buffer: within the browser's own playout delay the level
    # falls to silence and stays there (queued audio would keep it up for seconds).
    _wait(lambda: _inbound(page)["level"] < 0.005, 5, "silence after stop")
    quiet = []
    for _ in range(5):
        time.sleep(0.2)
        quiet.append(_inbound(page)["level"])
    assert max(quiet) < 0.005
    assert page.text_content("#error") == ""


@pytest.mark.browser
def test_microphone_mode_sends_the_mic_and_still_plays(page):
    page.check("#mic")
    page.fill("#text", "x" * 28)
    page.click("#speak")
    _wait(lambda: page.text_content("#status") in ("playing", "done", "stopped"), 30, "start")
    senders = page.evaluate(
        "() => window.cadenza.pc.getSenders()"
        ".filter((s) => s.track && s.track.kind === 'audio').length"
    )
    assert senders == 1


@pytest.mark.browser
def test_errors_are_shown(page):
    page.fill("#text", "")
    page.click("#speak")
    _wait(lambda: "empty_input" in (page.text_content("#error") or ""), 30, "the error")


@pytest.mark.browser
def test_a_full_server_shows_the_queue_position_then_plays(page, server):
    body = {"model": "cadenza-tiny", "input": "x" * 400, "response_format": "pcm"}
    capacity = f"{server.url}/v1/capacity"
    _wait(lambda: httpx.get(capacity).json()["active"] == 0, 60, "earlier tests' streams to end")
    with contextlib.ExitStack() as holders, httpx.Client(base_url=server.url, timeout=60) as http:
        for _ in range(SLOTS):  # every slot busy for seconds (28 s of audio each)
            response = holders.enter_context(http.stream("POST", "/v1/audio/speech", json=body))
            assert response.status_code == 200, response.read()
        page.fill("#text", "x" * 28)
        page.click("#speak")
        _wait(lambda: page.text_content("#status") == "waiting for a free slot", 10, "queueing")
        assert page.text_content("#queue").startswith("1 (about ")
    # Closing the held responses frees both slots; the page's stream is admitted and plays.
    _wait(lambda: page.text_content("#status") in ("playing", "done"), 30, "the slot")
    assert page.text_content("#queue") == "–"
    assert page.text_content("#error") == ""
