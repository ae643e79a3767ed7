"""Command line: ``cadenza serve | generate | plan | loadtest | bench | haproxy-config``
(also ``python -m cadenza``). One module per command, each with its ``add_parser`` and the
``run`` it sets as the parsed command's handler; :mod:`cadenza.cli.options` holds what they
share."""

from __future__ import annotations

import argparse
import sys

from cadenza.cli import bench, generate, haproxy_config, loadtest, plan, serve
from cadenza.cli.options import overrides
from cadenza.config import ConfigError, load_config

COMMANDS = (serve, generate, plan, loadtest, bench, haproxy_config)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, overrides(args))
    except ConfigError as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    status: int = args.run(config, args)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadenza", description="Real-time streaming speech/audio generation server."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser
