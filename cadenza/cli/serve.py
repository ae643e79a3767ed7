"""``cadenza serve``: the HTTP server, its engines in their own processes."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cadenza.cli.options import DeprecatedFlag, add_model_flags, command_parser
from cadenza.config import CadenzaConfig
from cadenza.contract.host_nodes import HostNode, default_registry_dir, register_node


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = command_parser(commands, "serve", "run the HTTP server (engine in its own process)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000)")
    serve.add_argument(
        "--node-id", help="this node's name in a fleet (header x-cadenza-node; default host:port)"
    )
    serve.add_argument(
        "--agent-port",
        type=int,
        help="answer HAProxy's agent check on this port: 'up ready N%%' (free headroom), "
        "'drain', 'down'",
    )
    serve.add_argument(
        "--redis-url",
        help="share the per-client rate limits across the fleet in Redis (redis://HOST:PORT/DB)",
    )
    serve.add_argument(
        "--api-keys-file", help="stream keys, one per line (or sha256:<hex>): auth.api_keys_file"
    )
    serve.add_argument(
        "--admin-keys-file",
        help="admin keys (same format), the only keys /admin/* takes: auth.admin_keys_file",
    )
    serve.add_argument(
        "--engine",
        choices=["cadenza", "naive"],
        help="naive: one thread per request with the transformers model (a load-test baseline)",
    )
    serve.add_argument(
        "--replicas",
        type=int,
        help="engine processes per model (default: one per core on a CPU-only machine with at "
        "most 2 cores, else 1; with several GPUs, one per device)",
    )
    serve.add_argument(
        "--engine-replicas",
        type=int,
        action=DeprecatedFlag,
        new="--replicas",
        help=argparse.SUPPRESS,
    )
    serve.add_argument(
        "--warm-spare",
        action="store_true",
        default=None,
        help="keep a loaded engine per replica that replaces a lost one at once",
    )
    serve.add_argument(
        "--drain-timeout-s",
        type=float,
        help="on SIGTERM: how long open streams may run on before ending (default 30)",
    )
    add_model_flags(serve)
    serve.set_defaults(run=run)


def run(config: CadenzaConfig, _: argparse.Namespace) -> int:
    # First of all, so that a node started beside this one sees it before either places its
    # engines on the host's cores.
    node = _register_on_host(config)
    import uvicorn

    from cadenza.edge.admission.guard import GuardError
    from cadenza.edge.auth.api_keys import ApiKeyFileError
    from cadenza.edge.server.app import create_app
    from cadenza.edge.server.draining_server import DrainingServer
    from cadenza.edge.transports.http_protocol import timed_h11_protocol
    from cadenza.edge.transports.ws_protocol import Utf8CheckedWebSocketProtocol
    from cadenza.logs import configure_logging

    configure_logging(config.server.log_level, process="edge")
    try:
        app = create_app(config, host_node=node)
    except (ApiKeyFileError, GuardError) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    server_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        timeout_graceful_shutdown=5,
        ws_max_size=config.server.ws_max_message_bytes,
        # X-Forwarded-For is read by the app itself, which keeps the socket peer first
        # (cadenza/edge/server/socket_peer.py).
        proxy_headers=False,
        # Audio does not compress: per-message deflate of PCM and Opus frames cost a third of
        # the edge's CPU under load for a few percent fewer bytes
        # (docs/journal/2026-12-02-engine-edge-and-admission-on-two-cores.md).
        ws_per_message_deflate=False,
        ws=Utf8CheckedWebSocketProtocol,  # a text message that is not UTF-8: 1007, no traceback
        http=timed_h11_protocol(
            config.server.request_head_timeout_s, config.server.send_buffer_bytes
        ),
    )
    DrainingServer(
        server_config, app, config.server.drain_timeout_s, freeze_heap=config.server.gc_freeze
    ).run()
    return 0


def _register_on_host(config: CadenzaConfig) -> HostNode | None:
    """This node's slot among the nodes on this host (``supervision.share_host``), held for
    the process's life; ``None`` (every core, as if alone) where sharing is off or the
    registry cannot be used."""
    if not config.supervision.share_host:
        return None
    directory = config.supervision.host_registry_dir
    try:
        return register_node(Path(directory) if directory else default_registry_dir())
    except (OSError, RuntimeError) as exc:
        logging.getLogger(__name__).warning(
            "cannot register with this host's other nodes (%s): using every core", exc
        )
        return None
