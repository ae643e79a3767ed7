"""What a request's credential grants: the :class:`Principal` every transport hands to
admission.

A principal is made by :class:`~cadenza.edge.auth.authenticator.Authenticator` from what the
client presented (a stream key, an admin key, a client token, or nothing on an open server).
It says whom the stream is charged to (``client``: rate limits, audio quotas, the owner of a
resume token), which credential holds it (``holder``: open streams are counted per holder) and,
for a client token, the scope its minter gave it (models, audio per stream, the web origin).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Literal

from cadenza.config import LimitsConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.stream_length import request_duration_s
from cadenza.edge.streams.errors import EdgeError

Kind = Literal["open", "stream_key", "admin_key", "client_token"]

TOKEN_LEEWAY_S = 5.0  # clock skew between the nodes of a fleet, allowed on a token's expiry


@dataclass(frozen=True)
class Principal:
    """Who is asking, and what they may do.

    ``client``: whom the stream is charged to: ``key:<id>`` for a key and every token it
    minted, ``ip:<address>`` on an open server. ``holder``: the credential itself
    (``key:<id>``, ``token:<id>`` or ``ip:<address>``). ``models``: the models a client token
    may open (``None``: any); ``max_audio_s``: the longest a token's stream may play (``None``:
    the server's limit); ``origin``: the only web origin a token is accepted from;
    ``expires_at``: a token's expiry (unix seconds)."""

    kind: Kind
    client: str
    holder: str
    models: frozenset[str] | None = None
    max_audio_s: float | None = None
    origin: str | None = None
    expires_at: float | None = None

    @classmethod
    def open_server(cls, peer: str | None) -> Principal:
        """Anyone on a server without API keys, known by address."""
        return cls(kind="open", client=f"ip:{peer}", holder=f"ip:{peer}")

    @property
    def may_administer(self) -> bool:
        """Whether ``/admin/*`` takes this credential (where admin keys are configured)."""
        return self.kind == "admin_key"

    @property
    def may_mint(self) -> bool:
        """Whether ``POST /v1/client_tokens`` takes this credential: keys mint; a client
        token never does, nor anyone on an open server (a token per request would multiply
        every per-client limit)."""
        return self.kind in ("stream_key", "admin_key")

    def renewed_by(self, fresh: Principal) -> Principal:
        """``fresh`` as this session's credential from now on (a ``hello`` in a session).
        Raises :class:`EdgeError` 403 ``forbidden`` when it is another client's: a session
        stays the client it opened as."""
        if fresh.client != self.client:
            raise EdgeError(
                403, "a session renews its credential with one of the same client", code="forbidden"
            )
        return fresh

    def check_current(self, now: float | None = None) -> None:
        """Raises :class:`EdgeError` 401 ``token_expired`` once a token has expired: a session
        opened with it starts no new stream after that (a ``hello`` with a fresh token of the
        same client renews it)."""
        if self.expires_at is None:
            return
        if (time.time() if now is None else now) > self.expires_at + TOKEN_LEEWAY_S:
            raise EdgeError(
                401,
                "the client token has expired (a session renews it with a fresh one in a hello)",
                code="token_expired",
            )

    def check_model(self, model: str) -> None:
        """Raises :class:`EdgeError` 403 ``model_not_allowed`` for a model outside a token's
        scope."""
        if self.models is not None and model not in self.models:
            allowed = ", ".join(repr(name) for name in sorted(self.models))
            raise EdgeError(
                403,
                f"this client token may not use model {model!r} (it may use: {allowed})",
                code="model_not_allowed",
                param="model",
            )

    def scoped(
        self,
        model: str,
        request: SynthesisRequest,
        limits: LimitsConfig,
        default_duration_s: float | None = None,
    ) -> SynthesisRequest:
        """``request`` within this principal's scope: its token current
        (:meth:`check_current`), its model allowed (:meth:`check_model`) and, under a token's
        ``max_audio_s``, its length capped there (a request that asks for more explicitly is
        refused with 403 ``audio_not_allowed``; one whose text would run longer ends at the
        cap; a text stream's segments share the cap: :class:`TextStream`)."""
        self.check_current()
        self.check_model(model)
        cap = self.max_audio_s
        if cap is None:
            return request
        if request.max_duration_s is not None:
            if request.max_duration_s > cap:
                raise EdgeError(
                    403,
                    f"this client token allows at most {cap:g} s of audio per stream",
                    code="audio_not_allowed",
                    param="max_duration_s",
                )
            return request
        derived = request_duration_s(request.text, None, limits, default_duration_s)
        if derived <= cap:
            return request
        return dataclasses.replace(request, max_duration_s=cap)
