"""``cadenza haproxy-config``: print the ``haproxy.cfg`` of the front door for a set of nodes
(:mod:`cadenza.cluster.haproxy_config`; docs/scaling.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cadenza.cluster.haproxy_config import BALANCE_ALGORITHMS, FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import Address, parse_address, parse_node
from cadenza.config import CadenzaConfig

HTTP_PORT = 80


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    haproxy = commands.add_parser(
        "haproxy-config",
        help="print an HAProxy 2.6 configuration that spreads streams over cadenza nodes",
        description="Print a complete haproxy.cfg for the front door of several cadenza "
        "nodes: HTTP, WebSocket and WebRTC signalling on one address, health checks on "
        "/readyz, weights from each node's agent, a refusal (503) retried on another node. "
        "Run it with `haproxy -f FILE`. See docs/scaling.md.",
    )
    haproxy.add_argument(
        "--listen", required=True, metavar="HOST:PORT", help="where clients connect"
    )
    haproxy.add_argument(
        "--node",
        required=True,
        action="append",
        metavar="HOST:PORT:AGENT_PORT",
        help="a cadenza server and its load agent's port (repeat for each node)",
    )
    haproxy.add_argument("--stats", metavar="HOST:PORT", help="serve HAProxy's stats page here")
    haproxy.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="certificate and key in one PEM file: --listen then speaks HTTPS (TLS 1.2 or "
        "later, with Strict-Transport-Security) and plain HTTP is redirected (--redirect-http)",
    )
    haproxy.add_argument(
        "--redirect-http",
        metavar="HOST:PORT",
        help="with --tls-cert: answer plain HTTP here with a 301 to HTTPS on --listen's port "
        "(default: port 80 on the --listen host; 'off': no plain listener)",
    )
    haproxy.add_argument(
        "--balance",
        choices=BALANCE_ALGORITHMS,
        default="leastconn",
        help="how a new stream picks its node (default: leastconn; streams are long)",
    )
    haproxy.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    haproxy.set_defaults(run=run)


def run(config: CadenzaConfig, args: argparse.Namespace) -> int:
    try:
        listen = parse_address(args.listen, "--listen")
        front_door = FrontDoor(
            listen=listen,
            nodes=tuple(parse_node(text) for text in args.node),
            stats=None if args.stats is None else parse_address(args.stats, "--stats"),
            tls_cert_pem=args.tls_cert,
            balance=args.balance,
            redirect_http=_redirect_http(args.redirect_http, listen, args.tls_cert is not None),
        )
    except ValueError as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_haproxy_config(front_door))
    return 0


def _redirect_http(text: str | None, listen: Address, tls: bool) -> Address | None:
    """Where plain HTTP is redirected from: ``text`` as given (``off``: nowhere), else port 80
    on the ``--listen`` host where the door speaks HTTPS (and does not listen on 80 itself)."""
    if text == "off":
        return None
    if text is not None:
        return parse_address(text, "--redirect-http")
    if not tls or listen.port == HTTP_PORT:
        return None
    return Address(listen.host, HTTP_PORT)
