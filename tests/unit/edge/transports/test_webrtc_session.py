"""A WebRTC utterance's play-out: it waits for the listener, but not for a track nobody reads."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np

from cadenza.edge.transports import webrtc
from cadenza.edge.transports.jitter_buffer import JitterBuffer


def test_play_out_gives_up_on_an_unread_track(monkeypatch) -> None:
    monkeypatch.setattr(webrtc, "PLAY_OUT_MARGIN_S", 0.1)
    buffer = JitterBuffer(webrtc.RTC_RATE, webrtc.FRAME_MS, 40)
    buffer.start()
    buffer.push(np.zeros(webrtc.RTC_RATE // 10, np.float32))  # 100 ms nobody will pull
    buffer.end()
    started = time.monotonic()
    asyncio.run(webrtc.WebRTCSession._play_out(SimpleNamespace(buffer=buffer)))  # type: ignore[arg-type]
    assert not buffer.active and buffer.depth_ms == 0
    assert time.monotonic() - started < 2.0
