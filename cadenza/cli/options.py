"""What several commands share: the configuration's help text, the model flags, the flags'
place in the configuration tree, and deprecated flags."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadenza.config import config_reference
from cadenza.config.old_keys import warn_deprecated

CONFIG_HELP = f"""\
configuration (flags > CADENZA_* environment > --config TOML file > defaults; a TOML file
uses the same sections, e.g. [server] port = 8001):
{config_reference()}
"""


def command_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    """A command whose --help ends with every configuration key."""
    return commands.add_parser(
        name,
        help=help,
        epilog=CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that loads a model: which, with which codec, where, in what."""
    parser.add_argument(
        "--model", help="built-in model name, checkpoint directory or cached hub id"
    )
    parser.add_argument(
        "--codec", help="codec instead of the model's (encodec_24khz, snac_24khz, a directory)"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--kv-dtype",
        dest="engine_kv_dtype",
        choices=["auto", "fp32", "fp16", "bf16", "int8"],
        help="KV cache dtype (int8: per-token-per-head scales, ~2x the tokens of fp16)",
    )
    parser.add_argument(
        "--weights-dtype", choices=["auto", "int8"], help="int8: weight-only int8 linears"
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of ``args`` as configuration keys (``None``: not given)."""
    replicas = getattr(args, "replicas", None)
    if replicas is None:
        replicas = getattr(args, "engine_replicas", None)
    codec_noise = getattr(args, "codec_noise", None)
    return {
        "server": {
            "host": getattr(args, "host", None),
            "port": getattr(args, "port", None),
            "node_id": getattr(args, "node_id", None),
            "agent_port": getattr(args, "agent_port", None),
            "drain_timeout_s": getattr(args, "drain_timeout_s", None),
        },
        "auth": {
            "api_keys_file": getattr(args, "api_keys_file", None),
            "admin_keys_file": getattr(args, "admin_keys_file", None),
        },
        "limits": {"redis_url": getattr(args, "redis_url", None)},
        "model": {
            "name": getattr(args, "model", None),
            "codec": getattr(args, "codec", None),
            "codec_noise": None if codec_noise is None else codec_noise == "on",
            "device": getattr(args, "device", None),
            "weights_dtype": getattr(args, "weights_dtype", None),
        },
        "supervision": {
            "replicas": replicas,
            "warm_spare": getattr(args, "warm_spare", None),
        },
        "engine": {
            "kind": getattr(args, "engine", None),
            "kv_dtype": getattr(args, "engine_kv_dtype", None),
        },
    }


class DeprecatedFlag(argparse.Action):
    """A flag of the previous release, still read (the new flag wins where both are given)
    with a warning that names the new one: ``add_argument("--old", action=DeprecatedFlag,
    new="--new", dest="old", help=argparse.SUPPRESS)``."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        warn_deprecated("flag", option_string or self.dest, self.new)
        setattr(namespace, self.dest, values)
