"""``cadenza haproxy-config``: print the ``haproxy.cfg`` of the front door for a set of nodes
(:mod:`cadenza.cluster.haproxy_config`; docs/scaling.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cadenza.cluster.haproxy_config import BALANCE_ALGORITHMS, FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import parse_address, parse_node
from cadenza.config import CadenzaConfig


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
        help="certificate and key in one PEM file: --listen then speaks HTTPS",
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
        front_door = FrontDoor(
            listen=parse_address(args.listen, "--listen"),
            nodes=tuple(parse_node(text) for text in args.node),
            stats=None if args.stats is None else parse_address(args.stats, "--stats"),
            tls_cert_pem=args.tls_cert,
            balance=args.balance,
        )
    except ValueError as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_haproxy_config(front_door))
    return 0
