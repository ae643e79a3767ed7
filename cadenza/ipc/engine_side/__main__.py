"""The engine process: ``python -m cadenza.ipc.engine_side --config-file PATH --inbound ...
--outbound ... --replica N``, started by
:class:`~cadenza.ipc.edge_side.engine_client.EngineClient` (the configuration as JSON in a file
only its user may read, never on the command line, which every user may). It places itself
(:func:`~cadenza.ipc.engine_side.replica_placement.place_replica`, before torch is imported,
its start already reported to the edge), then serves
(:func:`~cadenza.ipc.engine_side.engine_loop.run_engine_loop`) until ``shutdown``."""

from __future__ import annotations

import argparse
import json

import zmq

from cadenza.config import CadenzaConfig
from cadenza.gc_pauses import settle_after_loading
from cadenza.ipc.engine_side.engine_loop import run_engine_loop
from cadenza.ipc.engine_side.replica_placement import place_replica
from cadenza.logs import configure_logging


def main() -> None:
    parser = argparse.ArgumentParser(description="cadenza engine process (started by the edge)")
    parser.add_argument("--config-file", required=True, help="the configuration, as JSON")
    parser.add_argument("--inbound", required=True)
    parser.add_argument("--outbound", required=True)
    parser.add_argument("--replica", type=int, default=0, help="replica index (GPU choice)")
    args = parser.parse_args()
    with open(args.config_file, encoding="utf-8") as file:
        config = CadenzaConfig.model_validate(json.load(file))
    configure_logging(config.server.log_level, process=f"engine-{args.replica}")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        run_engine_loop(
            config,
            context,
            args.inbound,
            args.outbound,
            after_load=lambda: settle_after_loading(config.server.gc_freeze),
            place=lambda config: place_replica(config, args.replica),
        )
    finally:
        context.term()


if __name__ == "__main__":
    main()
