"""One STUN or TURN server for WebRTC's ICE (``server.webrtc_ice_servers``), as the browser's
``RTCIceServer`` names it."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator, model_validator

from cadenza.config.section import Section

_URL = re.compile(r"^(stun|stuns|turn|turns):[^\s:?]+(:\d{1,5})?(\?transport=(udp|tcp))?$")


class IceServer(Section):
    """``urls``: ``stun:HOST[:PORT]``, ``turn:HOST[:PORT][?transport=udp|tcp]`` or
    ``turns:...``. A TURN server takes either fixed long-term credentials (``username`` and
    ``credential``, handed to every client as they are) or ``secret``: the relay's shared
    secret (coturn's ``static-auth-secret`` with ``use-auth-secret``), from which the server
    computes credentials that expire (:mod:`cadenza.edge.transports.turn_credentials`). The
    secret itself never leaves the server: it is not in any answer, and its ``repr`` masks it.
    """

    urls: list[str] = Field(min_length=1, max_length=8)
    username: str | None = Field(None, max_length=256)
    credential: str | None = Field(None, max_length=256)
    secret: SecretStr | None = None

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

    @field_validator("secret")
    @classmethod
    def _secret(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None and not 0 < len(secret.get_secret_value().strip()) <= 256:
            raise ValueError("the TURN secret must be 1 to 256 characters, not blank")
        return secret

    @model_validator(mode="after")
    def _one_kind_of_credential(self) -> IceServer:
        if self.secret is None:
            return self
        if self.username is not None or self.credential is not None:
            raise ValueError(
                "give either secret (credentials that expire) or username and credential "
                "(fixed ones), not both"
            )
        if not all(url.startswith("turn") for url in self.urls):
            raise ValueError("secret is for TURN servers only: every URL must be turn: or turns:")
        return self

    def is_turn(self) -> bool:
        return any(url.startswith("turn") for url in self.urls)
