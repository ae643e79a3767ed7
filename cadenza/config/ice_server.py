"""One STUN or TURN server for WebRTC's ICE (``server.webrtc_ice_servers``), as the browser's
``RTCIceServer`` names it."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from cadenza.config.section import Section

_URL = re.compile(r"^(stun|stuns|turn|turns):[^\s:?]+(:\d{1,5})?(\?transport=(udp|tcp))?$")


class IceServer(Section):
    """``urls``: ``stun:HOST[:PORT]``, ``turn:HOST[:PORT][?transport=udp|tcp]`` or
    ``turns:...``; ``username`` and ``credential`` for TURN."""

    urls: list[str] = Field(min_length=1, max_length=8)
    username: str | None = Field(None, max_length=256)
    credential: str | None = Field(None, max_length=256)

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not _URL.match(url):
                raise ValueError(
                    f"{url!r} is not a STUN/TURN URL (stun:HOST:PORT, turn:HOST:PORT"
                    "[?transport=udp|tcp], turns:HOST:PORT)"
                )
            port = url.split("?")[0].split(":")[2:]
            if port and not 0 < int(port[0]) < 65536:
                raise ValueError(f"{url!r}: port out of range")
        return urls

    def is_turn(self) -> bool:
        return any(url.startswith("turn") for url in self.urls)
