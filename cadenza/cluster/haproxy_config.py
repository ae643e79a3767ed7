"""The front door: one ``haproxy.cfg`` (HAProxy 2.6) that spreads streams over cadenza nodes.

:func:`render_haproxy_config` turns a :class:`FrontDoor` (where to listen, the nodes, the
stats page, a TLS certificate, the balancing algorithm) into the whole file; it does no I/O.
Every choice below cites the HAProxy 2.6 configuration manual (``configuration.txt``, the
Debian package ships it as ``/usr/share/doc/haproxy/configuration.txt.gz``).

What passes through, and what does not
    One ``mode http`` frontend and one backend carry everything a node serves: the speech
    endpoint ``POST /v1/audio/speech`` (a long streamed body), the WebSocket ``/v1/stream``
    (HAProxy follows the ``Upgrade`` natively; afterwards the connection is a tunnel) and
    WebRTC signalling ``POST /v1/webrtc/offer``. WebRTC *media* never passes through
    HAProxy: the answer to an offer carries the ICE candidates of the node that answered,
    and the browser sends its audio straight to that node (UDP), so a node must be
    reachable by clients for media (or through a TURN server), not only through HAProxy.
    The client's address reaches the node in ``X-Forwarded-For`` (``option forwardfor``),
    after whatever the client sent in that header is dropped (``http-request del-header``):
    a node that believes the proxy (``server.forwarded_allow_ips``) keys its per-client
    limits on that address, which a client must not be able to choose.
    ``/admin/*`` is refused at the door (403, the path compared once percent-decoded, as
    the node routes it): it acts on one node, which an operator names by calling that node
    directly; through a balancer it would act on whichever node the request landed on, and
    a node without API keys trusts loopback callers, which HAProxy on the same host would
    make everyone.

Health and weights
    ``option httpchk GET /readyz`` with ``http-check expect status 200``: a node that is
    starting, draining or without a usable engine answers 503 and is taken out after two
    failed checks (``fall 2``, 2 s apart). Each node's agent (``agent-check``, manual section
    5.2) is asked every second (``agent-inter 1s``) and answers one line: ``up 37%`` sets the
    weight to 37% of the configured one, ``drain`` stops new streams (open ones go on),
    ``down`` takes the node out. Servers are declared ``weight 100`` so that a percentage is
    a weight from 0 to 100: at HAProxy's default weight of 1, anything under 100% rounds to
    0. Note for agents: only the word ``ready`` cancels ``drain`` (or ``maint``); an agent
    that drained a node must answer ``ready`` (``ready up 60%``) to bring it back, a bare
    ``up 60%`` leaves it drained. A node marked down by its checks keeps its open streams
    (no ``on-marked-down shutdown-sessions``): they end when the node ends them.

Balancing
    ``balance leastconn`` by default: the node with the fewest connections relative to its
    weight takes the new stream. Streams are long-lived (seconds to minutes of audio, a
    WebSocket session for as long as the user talks) and uneven in length, so counting the
    requests a node was sent (``roundrobin``) says little about the load it carries now; the
    manual recommends leastconn "where very long sessions are expected". Both algorithms are
    dynamic, so the agent's weights apply to both; ``balance`` is a parameter so that they
    can be measured against each other.

Retrying a refusal on another node
    A node refuses a stream it cannot hold with 503 (``queue_full``, ``queue_timeout``,
    ``engine_unavailable``, ``shutting_down``) and ``Retry-After``. It does so before any
    audio: the speech endpoint sends its status line only with the first audio chunk, so a
    503 is always a whole response about a stream that never started, and sending the same
    request to another node cannot play anything twice. ``retry-on conn-failure
    empty-response 503`` with ``retries 2`` and ``option redispatch 1`` (every retry on
    another node) lets HAProxy resend such a request elsewhere before the client sees
    anything; when every try is refused the client gets the last node's own 503, with its
    ``Retry-After``. (``empty-response`` covers a node that closed a reused idle connection
    just as the request was sent, or that died before answering.)

    What is retried is what a node refuses in its HTTP answer: a speech request, a WebRTC
    offer (503 when too many peers are pending, or the node drains), a WebSocket upgrade
    while the node drains or has no engine, and one that asks to spill
    (``X-Cadenza-Spill: 1``, as the SDK does) while the node could not start one more stream
    at once (503 ``at_capacity``; it counts the sessions it accepted a moment before that
    have not spoken yet, so a burst of upgrades does not all pass on one free slot). That is
    what spreads a burst: the agents' weights are up to ``agent-inter`` old, and leastconn
    counts connections, not streams. Once accepted, a WebSocket's utterances are admitted
    inside the session, so a refusal there is an ``error`` message the client handles (the
    SDK connects again through the front door, asking to spill, and sends the utterance to
    a node with room if one has it).

    Two limits of HAProxy's layer-7 retries (manual, ``retry-on``): a response already
    being forwarded cannot be retried (HAProxy decides on the status line, before it
    forwards anything), and a request can only be resent if HAProxy holds all of it. The
    whole request must fit in one buffer (``tune.bufsize``; larger requests are never
    retried), and it must have been received completely when its first byte goes to the
    node: HAProxy's sender (``src/stconn.c``) keeps a copy only of a finished request and
    otherwise gives up retrying it. Hence ``option http-buffer-request`` (wait for the whole
    body before choosing a node) and ``tune.bufsize`` sized for the largest body a node
    accepts (64 KiB, ``edge/transports/speech_http.py``) plus headers. A buffer is allocated per
    direction only while it holds data.

Timeouts
    ``timeout tunnel 1h`` governs a WebSocket once upgraded (inactivity in both directions;
    the node closes idle WebSockets itself after ``server.ws_idle_timeout_s``, so HAProxy is
    never the one that cuts a live session). ``timeout server 5m`` covers a request the node
    keeps in its admission queue (up to ``admission.batch_max_wait_s``, 120 s by default)
    before its first byte; ``timeout client 5m`` the client side of a long streamed body
    (the node drops a client that stops reading after ``server.send_timeout_s`` anyway).
    ``timeout http-request 15s`` bounds the request head and, with the buffered body, the
    body too (the node's own limits are 10 s each).

TLS
    With a certificate (one PEM file holding the certificate chain and its key), the
    listening port speaks HTTPS: ``bind ... ssl crt PEM``; nodes are reached in plain HTTP
    on the private network. Clients speak HTTP/1.1 (no ALPN is offered), as the nodes do.
    ``ssl-min-ver TLSv1.2`` on the bind refuses TLS 1.0 and 1.1 (HAProxy 2.6 already
    defaults to it; written out so that the file says so whatever the build's default).
    Every answer, HAProxy's own refusals included (``http-after-response``, manual 4.2,
    unlike ``http-response``, which only sees the nodes' answers), carries
    ``Strict-Transport-Security: max-age=63072000`` (two years, no ``includeSubDomains``:
    the operator's other names are not this door's to promise): a browser that saw it once
    never speaks plain HTTP to this name again. ``redirect_http`` adds a plain listener (the
    command's default: port 80 on the ``--listen`` host) whose every answer is a ``301`` to
    the same path over HTTPS; it has no backend, so nothing sent to it, ``/admin`` included,
    reaches a node. Its ``Host`` is rewritten first (``replace-header``): the client's port,
    if any, becomes the TLS port (left out where it is 443), then ``redirect scheme https``
    builds the location from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from cadenza.cluster.node_address import Address, Node

Balance = Literal["leastconn", "roundrobin"]
BALANCE_ALGORITHMS: tuple[str, ...] = get_args(Balance)

# The largest request a node accepts: its speech body limit (64 KiB,
# edge/transports/speech_http.py) and room for headers; a request must fit in one buffer to be
# retried.
REQUEST_BUFFER_BYTES = 80 * 1024
RETRIES = 2  # up to three nodes per request: a refused request is answered in bounded time
AGENT_INTERVAL = "1s"
CHECK_INTERVAL = "2s"
TIMEOUTS = {  # name -> HAProxy duration; the module docstring says why each
    "connect": "5s",
    "client": "5m",
    "server": "5m",
    "http-request": "15s",
    "http-keep-alive": "30s",
    "tunnel": "1h",
    "client-fin": "30s",
    "check": "2s",
}
_SAFE_PATH = re.compile(r"[^\s\"'#\\]+")
MIN_TLS_VERSION = "TLSv1.2"
HSTS = "max-age=63072000"  # two years
HTTPS_PORT = 443


@dataclass(frozen=True)
class FrontDoor:
    """What the front door is: it listens on ``listen`` (HTTPS with ``tls_cert_pem``, a PEM
    file of certificate and key as HAProxy reads it), spreads streams over ``nodes`` by
    ``balance``, serves its stats page on ``stats`` when given, and with TLS answers plain
    HTTP on ``redirect_http`` with a redirect to HTTPS (``None``: no plain listener). Raises
    ``ValueError``, naming the flag, for a configuration HAProxy could not run."""

    listen: Address
    nodes: tuple[Node, ...]
    stats: Address | None = None
    tls_cert_pem: str | None = None
    balance: Balance = "leastconn"
    redirect_http: Address | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("--node: give at least one node (HOST:PORT:AGENT_PORT)")
        seen: set[Address] = set()
        for node in self.nodes:
            if node.address in seen:
                raise ValueError(f"--node {str(node)!r}: {node.address} is given twice")
            seen.add(node.address)
        if self.stats is not None and self.stats == self.listen:
            raise ValueError(f"--stats {str(self.stats)!r}: the same address as --listen")
        if self.tls_cert_pem is not None and not _SAFE_PATH.fullmatch(self.tls_cert_pem):
            raise ValueError(
                f"--tls-cert {self.tls_cert_pem!r}: give a path without spaces, quotes, '#' "
                "or backslashes"
            )
        if self.redirect_http is not None:
            if self.tls_cert_pem is None:
                raise ValueError(
                    f"--redirect-http {str(self.redirect_http)!r}: redirects to HTTPS need "
                    "--tls-cert"
                )
            if self.redirect_http in (self.listen, self.stats):
                raise ValueError(
                    f"--redirect-http {str(self.redirect_http)!r}: the same address as "
                    f"{'--listen' if self.redirect_http == self.listen else '--stats'}"
                )
        if self.balance not in BALANCE_ALGORITHMS:
            raise ValueError(
                f"--balance {self.balance!r}: expected one of {', '.join(BALANCE_ALGORITHMS)}"
            )


def render_haproxy_config(front_door: FrontDoor) -> str:
    """The complete ``haproxy.cfg`` for ``front_door`` (``haproxy -c -f`` accepts it)."""
    tls = front_door.tls_cert_pem is not None
    bind = f"bind {front_door.listen}"
    if tls:
        bind += f" ssl crt {front_door.tls_cert_pem} ssl-min-ver {MIN_TLS_VERSION}"
    sections = [
        [
            "# The front door of a cadenza cluster, rendered by `cadenza haproxy-config`",
            "# (cadenza/cluster/haproxy_config.py explains every choice). HAProxy 2.6.",
            "global",
            "    log stdout format raw local0 info",
            f"    tune.bufsize {REQUEST_BUFFER_BYTES}",
        ],
        [
            "defaults",
            "    mode http",
            "    log global",
            "    option httplog",
            "    option dontlognull",
            *(f"    timeout {name} {value}" for name, value in TIMEOUTS.items()),
        ],
        [
            "frontend cadenza",
            f"    {bind}",
            *(
                [f'    http-after-response set-header Strict-Transport-Security "{HSTS}"']
                if tls
                else []
            ),
            "    http-request del-header X-Forwarded-For",
            "    option forwardfor",
            f"    http-request set-header X-Forwarded-Proto {'https' if tls else 'http'}",
            "    http-request deny deny_status 403 if { path,url_dec -m beg /admin/ }",
            "    default_backend cadenza_nodes",
        ],
        [
            "backend cadenza_nodes",
            f"    balance {front_door.balance}",
            "    option httpchk GET /readyz",
            "    http-check expect status 200",
            "    option http-buffer-request",
            "    retry-on conn-failure empty-response 503",
            f"    retries {RETRIES}",
            "    option redispatch 1",
            f"    default-server check inter {CHECK_INTERVAL} fall 2 rise 2 weight 100"
            f" agent-check agent-inter {AGENT_INTERVAL}",
            *(
                f"    server node{index} {node.address} agent-port {node.agent_port}"
                for index, node in enumerate(front_door.nodes, start=1)
            ),
        ],
    ]
    if front_door.redirect_http is not None:
        port = front_door.listen.port
        host = r"\1" if port == HTTPS_PORT else rf"\1:{port}"
        sections.append(
            [
                "frontend cadenza_http",
                f"    bind {front_door.redirect_http}",
                rf"    http-request replace-header Host ^(.*?)(:[0-9]+)?$ {host}",
                "    http-request redirect scheme https code 301",
            ]
        )
    if front_door.stats is not None:
        sections.append(
            [
                "frontend stats",
                f"    bind {front_door.stats}",
                "    stats enable",
                "    stats uri /",
                "    stats refresh 5s",
            ]
        )
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"
