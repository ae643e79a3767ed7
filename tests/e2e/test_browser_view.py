"""What the browser page draws, in headless Chromium against the server: the waveform of the
audio it plays and the plot of the server's jitter buffer; and that type-in mode opens a text
stream."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.e2e.test_browser_client import ARGS, CHROMIUM
from tests.integration.server import serving

# Every message the page sends on its data channel, kept in window.sentMessages.
RECORD_SENT = """
const send = RTCDataChannel.prototype.send;
window.sentMessages = [];
RTCDataChannel.prototype.send = function (data) {
  window.sentMessages.push(data);
  return send.call(this, data);
};
"""

# The canvas's coloured pixels (the page draws its axes, labels and idle line in grey), and
# how many pixel rows they cover: a flat line covers two or three.
INK = """(id) => {
  const canvas = document.getElementById(id);
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const rows = new Set();
  let pixels = 0;
  for (let i = 0; i < data.length; i += 4) {
    const [r, g, b, alpha] = data.slice(i, i + 3 + 1);
    if (alpha > 128 && Math.max(r, g, b) - Math.min(r, g, b) > 60) {
      pixels += 1;
      rows.add(Math.floor(i / 4 / canvas.width));
    }
  }
  return {pixels, rows: rows.size};
}"""


TYPED = "Hello there, my friend. This is typed in. One word at a time!"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("browser-view") / "server.log") as running:
        yield running


@pytest.fixture
def page(server):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(RECORD_SENT)
            page.goto(server.url)
            yield page
        finally:
            browser.close()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _sent(page: Page) -> list[dict[str, Any]]:
    return [json.loads(data) for data in page.evaluate("window.sentMessages")]


@pytest.mark.browser
def test_the_page_draws_the_waveform_and_the_buffer_while_audio_plays(page):
    assert page.evaluate(INK, "waveform")["pixels"] == 0  # the grey idle line only
    page.fill("#text", "x" * 112)  # eight seconds
    page.click("#speak")
    _wait(lambda: page.text_content("#status") == "playing", 30, "playback to start")
    _wait(lambda: page.evaluate(INK, "waveform")["rows"] > 8, 20, "a waveform on the canvas")
    _wait(lambda: page.evaluate(INK, "buffer-plot")["pixels"] > 20, 10, "the buffer's line")
    drawn = page.evaluate("window.cadenzaView")
    assert drawn["waveformFrames"] > 0
    assert drawn["bufferPoints"] > 0
    page.click("#stop")
    _wait(lambda: page.text_content("#status") == "stopped", 10, "the stop to be confirmed")
    assert page.text_content("#error") == ""


@pytest.mark.browser
def test_type_in_mode_opens_a_text_stream_and_stop_ends_the_typing(page):
    page.check("#type-in")
    page.fill("#type-in-rate", "2")
    page.fill("#text", " ".join(["word"] * 40))
    page.click("#speak")

    def speak() -> dict[str, Any] | None:
        return next((m for m in _sent(page) if m["type"] == "speak"), None)

    _wait(lambda: speak() is not None, 30, "the speak message")
    message = speak()
    assert message is not None
    assert message["text_stream"] is True
    assert message["text"] == ""
    assert message["priority"] == "standard"
    page.click("#stop")
    _wait(lambda: any(m["type"] == "cancel" for m in _sent(page)), 5, "the cancel")
    time.sleep(1.5)  # three words' time at 2 words/s
    types = [m["type"] for m in _sent(page)]
    assert "text" not in types[types.index("cancel") :]


@pytest.mark.browser
def test_type_in_mode_speaks_the_words_as_they_are_typed_and_ends_with_done(page):
    page.check("#type-in")
    page.fill("#type-in-rate", "20")
    page.fill("#text", TYPED)
    page.click("#speak")
    _wait(lambda: page.text_content("#segment") not in ("", None), 30, "the first segment")
    _wait(lambda: page.text_content("#status") == "done", 60, "the stream's done")
    sent = _sent(page)
    words = [m["text"] for m in sent if m["type"] == "text"]
    assert "".join(words).split() == TYPED.split(" ")
    assert [m["type"] for m in sent].count("text_end") == 1
    assert page.text_content("#error") == ""
