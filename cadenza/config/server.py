"""``[server]``: the edge process, where it listens and how it treats its connections."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator

from cadenza.config.ice_server import IceServer
from cadenza.config.section import Section


class ServerConfig(Section):
    """The edge process: where it listens and how it logs."""

    @property
    def node_name(self) -> str:
        """The node's name: ``node_id``, or ``host:port`` where none is set."""
        return self.node_id or f"{self.host}:{self.port}"

    host: str = Field("127.0.0.1", description="address the HTTP server binds to")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one)")
    node_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="this node's name in a fleet: the x-cadenza-node header, the WebSocket "
        "greeting's node and the metrics' node label (letters, digits, '.', '_', ':', '-'; "
        "unset: host:port)",
    )
    agent_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="TCP port of the HAProxy agent check on the server's host (unset: no agent; "
        "0 picks a free one): 'up ready N%' with the free real-time headroom, 'drain', 'down'",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="log level of the edge and engine processes"
    )
    gc_freeze: bool = Field(
        True,
        description="once loaded, the edge and engine processes keep what they loaded out of "
        "the garbage collector's walks (gc.freeze): a full collection otherwise stalls every "
        "stream of the process for 50-250 ms (cadenza/gc_pauses.py)",
    )
    max_queued_chunks: int = Field(
        256, ge=1, description="audio chunks one stream may have waiting for its client"
    )
    ws_idle_timeout_s: float = Field(
        60.0, gt=0, description="close a WebSocket that sends nothing and streams nothing"
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="drop a client (WebSocket or HTTP) whose connection takes no data for this "
        "long; its stream's slot is freed at once",
    )
    send_buffer_bytes: int = Field(
        262144,
        ge=0,
        description="socket send buffer per connection (0: the kernel's, which grows to MBs "
        "and hides a client that stopped reading for minutes)",
    )
    request_head_timeout_s: float = Field(
        10.0, gt=0, description="close a connection whose request line and headers take longer"
    )
    request_body_timeout_s: float = Field(
        10.0, gt=0, description="refuse a request whose body stalls for this long (408)"
    )
    jitter_reserve_ms: int = Field(
        100, ge=0, le=2000, description="audio buffered before a WebRTC utterance starts playing"
    )
    webrtc_connect_timeout_s: float = Field(
        30.0, gt=0, description="close a WebRTC peer that has not connected by then"
    )
    max_pending_webrtc_offers: int = Field(
        32, ge=1, description="WebRTC peers waiting to connect at once; more offers get 503"
    )
    max_pending_webrtc_offers_per_client: int = Field(
        4,
        ge=1,
        description="WebRTC peers one credential (an API key, a client token, an address on "
        "an open server) may have waiting to connect at once; more of its offers get 429 "
        "too_many_offers, so that one client cannot hold every pending place",
    )
    webrtc_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="close a connected WebRTC peer that sends no control message and plays "
        "nothing for this long (as ws_idle_timeout_s does a WebSocket)",
    )
    webrtc_ice_servers: list[IceServer] = Field(
        default_factory=list,
        max_length=8,
        description="STUN/TURN servers for WebRTC, used by the server's peers and handed to the "
        'browser page (JSON: [{"urls": ["turn:HOST:3478"], "username": ..., "credential": ...}], '
        'or {"urls": [...], "secret": ...} with the relay\'s use-auth-secret for credentials that '
        "expire); empty: host candidates only",
    )
    turn_credential_ttl_s: int = Field(
        3600,
        ge=60,
        le=86400,
        description="how long the TURN credentials computed from a webrtc_ice_servers secret "
        "stay valid: a relayed session cannot outlive them by more than its allocation's "
        "lifetime (the relay refuses refreshes after), and a leaked one relays until then",
    )
    forwarded_allow_ips: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        max_length=64,
        description="addresses of the proxies whose X-Forwarded-For and X-Forwarded-Proto the "
        "server believes (IPs, CIDR networks such as 10.0.0.0/8, or '*'): behind a front door, "
        "the client's own address then names it for per-client limits and logs",
    )
    webrtc_public_address: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9.:-]+$",
        description="the address clients reach this node's WebRTC media at (a pod's or NAT's "
        "public IP, same ports): the answer's host candidates name it; unset: the node's own",
    )

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        f"{entry!r} is not an IP address, a CIDR network or '*'"
                    ) from None
        return entries

    ws_max_message_bytes: int = Field(
        65536,
        ge=1024,
        description="largest message a client may send on a WebSocket (a larger one closes it "
        "with 1009) or on a WebRTC control channel (a larger one is refused with "
        "message_too_large)",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM or POST /admin/drain: how long open streams may run on before "
        "they are ended with shutting_down (and, for a rolling restart, per replica)",
    )
    checkpoint_ttl_s: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="with limits.redis_url: how long a WebSocket stream's resume checkpoint "
        "outlives its last write, for its client to resume it on another node when this one is "
        "lost (0: no checkpoints)",
    )
    resume_timeout_s: float = Field(
        30.0,
        ge=0,
        description="how long a stream whose engine was lost may wait for a replica to resume "
        "it on (0: never resume; the stream fails with engine_unavailable)",
    )
