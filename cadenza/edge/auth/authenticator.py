"""A credential to a :class:`~cadenza.edge.auth.principal.Principal`: the one place every
transport and route asks who is calling.

What is accepted (docs/security.md):

* an admin key (``auth.admin_keys_file``): streams, mints tokens, and is the only credential
  ``/admin/*`` takes when admin keys are configured;
* a stream key (``auth.api_keys_file``): streams and mints tokens;
* a client token (``auth.token_secret``): streams within its scope, from its origin, while
  the key that minted it is still configured (a token of a key taken out of the key files, or
  one minted by an open server, is refused by a server with keys);
* nothing, on a server without stream keys (open): streams, known by address. A token
  presented to an open server still binds its scope, and a bad one is still refused.

Refusals are :class:`EdgeError`: 401 ``invalid_api_key`` (missing or unknown key),
``invalid_token`` or ``token_expired``; 403 ``origin_not_allowed`` for a token used from
another origin than the one it was minted for; 429 ``too_many_auth_failures`` for an address
that failed too often (:mod:`~cadenza.edge.auth.auth_failures`).
"""

from __future__ import annotations

from cadenza.config.auth import AuthConfig
from cadenza.edge.auth.api_keys import ApiKeys
from cadenza.edge.auth.auth_failures import AuthFailures
from cadenza.edge.auth.client_tokens import ClientTokens, TokenRefused, looks_like_token
from cadenza.edge.auth.origins import normalized_origin, split_host
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.errors import EdgeError

_LOOPBACK = ("127.0.0.1", "::1")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class Authenticator:
    """Stream keys, admin keys and client tokens as configured (``None``: not configured)."""

    def __init__(
        self,
        api_keys: ApiKeys | None = None,
        admin_keys: ApiKeys | None = None,
        tokens: ClientTokens | None = None,
        failures: AuthFailures | None = None,
    ) -> None:
        self.api_keys = api_keys
        self.admin_keys = admin_keys
        self.tokens = tokens
        self.failures = failures or AuthFailures()
        self._minters = frozenset(
            f"key:{key_id}"
            for keys in (api_keys, admin_keys)
            if keys is not None
            for key_id in keys.ids()
        )

    @classmethod
    def from_config(cls, config: AuthConfig) -> Authenticator:
        """Reads the key files. Raises ``ApiKeyFileError`` naming a file that cannot be used."""
        secret = config.token_secret
        return cls(
            api_keys=ApiKeys.load(config.api_keys_file) if config.api_keys_file else None,
            admin_keys=ApiKeys.load(config.admin_keys_file) if config.admin_keys_file else None,
            tokens=None if secret is None else ClientTokens(secret.get_secret_value()),
        )

    @property
    def is_open(self) -> bool:
        """Whether streams need no key (no stream keys configured)."""
        return self.api_keys is None

    def principal(
        self, credential: str | None, peer: str | None, origin: str | None = None
    ) -> Principal:
        """Who presents ``credential`` (a key or a client token; ``None``: none) from address
        ``peer``, with the request's ``Origin`` header ``origin``. Raises :class:`EdgeError`
        (see the module docstring)."""
        retry = self.failures.retry_after_s(peer)
        if retry is not None:
            raise EdgeError(
                429,
                "too many failed authentication attempts from this address",
                code="too_many_auth_failures",
                retry_after_s=retry,
            )
        try:
            return self._principal(credential, peer, origin)
        except EdgeError as exc:
            if exc.status == 401:
                self.failures.failed(peer)
            raise

    def _principal(self, credential: str | None, peer: str | None, origin: str | None) -> Principal:
        if credential:
            for keys, kind in ((self.admin_keys, "admin_key"), (self.api_keys, "stream_key")):
                key_id = None if keys is None else keys.check(credential)
                if key_id is not None:
                    client = f"key:{key_id}"
                    return Principal(kind=kind, client=client, holder=client)  # type: ignore[arg-type]
            if looks_like_token(credential) and self.tokens is not None:
                try:
                    principal = self.tokens.verify(credential)
                except TokenRefused as exc:
                    raise EdgeError(
                        401, exc.message, code=exc.code, headers={"WWW-Authenticate": "Bearer"}
                    ) from None
                if not self.is_open and principal.client not in self._minters:
                    raise EdgeError(
                        401,
                        "the key that minted this client token is no longer accepted",
                        code="invalid_token",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                if principal.origin is not None and principal.origin != normalized_origin(origin):
                    raise EdgeError(
                        403,
                        "this client token is bound to another web origin",
                        code="origin_not_allowed",
                    )
                return principal
        if self.is_open:
            return Principal.open_server(peer)
        raise EdgeError(
            401,
            "missing or invalid API key or client token (send Authorization: Bearer <key>)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def administrator(
        self,
        credential: str | None,
        socket_peer: str | None,
        forwarded: bool,
        host: str | None = None,
        origin: str | None = None,
    ) -> Principal | None:
        """Whether ``/admin/*`` answers: with admin keys configured, only an admin key (401
        without a valid credential, 403 for a stream key or token); without them, only a
        request whose socket peer is the loopback interface, that no proxy forwarded
        (``forwarded``: it carries ``X-Forwarded-For``/``Forwarded``), that names this host
        by a loopback name (``host``: its ``Host``, so a page that rebinds its own name to
        127.0.0.1 does not pass) and that no web page sent (``origin``: its ``Origin``),
        whatever it presents. Returns the admin key's principal (``None`` for the loopback
        peer). Raises :class:`EdgeError`."""
        if self.admin_keys is not None:
            principal = self.principal(credential, socket_peer)
            if not principal.may_administer:
                raise EdgeError(403, "this route takes an admin key", code="forbidden")
            return principal
        if (
            socket_peer not in _LOOPBACK
            or forwarded
            or origin is not None
            or (split_host(host or "") or ("", None))[0] not in _LOOPBACK_NAMES
        ):
            raise EdgeError(
                403,
                "without admin keys (auth.admin_keys_file) the admin routes answer only "
                "requests made on this host's loopback interface",
                code="forbidden",
            )
        return None
