"""Where an engine replica runs: its GPU, or its share of the CPU's cores (and the threads it
runs there). Called in the engine process, first thing, before torch is imported."""

from __future__ import annotations

import os

from cadenza.config import CadenzaConfig
from cadenza.contract.cpu_replicas import (
    core_sharers,
    cores_per_replica,
    replica_count,
    usable_cores,
)


def place_replica(config: CadenzaConfig, replica: int) -> CadenzaConfig:
    """Where replica ``replica`` of ``supervision.replicas`` runs, and the configuration it runs
    with (call before torch is imported). On a GPU machine the replicas spread over the
    devices, one per device (round robin). On the CPU they divide the cores as
    :mod:`cadenza.contract.cpu_replicas` says: each pinned to its own share, running that many
    torch threads (unless ``model.torch_threads`` says otherwise), or all sharing every core
    with OpenMP threads that sleep instead of spinning when idle, so that a busy replica gets
    the cores an idle one leaves. The configuration returned names the replica count
    (``supervision.replicas``) as decided here, before the process is pinned to its share."""
    replicas = replica_count(
        config.supervision.replicas,
        config.model.device,
        config.supervision.mode,
        config.engine.kind,
    )
    # The count as the edge decided it (this process is about to see only its own cores).
    supervision = config.supervision.model_copy(update={"replicas": replicas})
    config = config.model_copy(update={"supervision": supervision})
    cores = usable_cores()
    share = cores_per_replica(replicas, len(cores))
    if core_sharers(replicas, len(cores)) > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.model.device != "cpu" and count > 0:
        if count > 1:
            torch.cuda.set_device(replica % count)
        return config
    if share == 0:
        return config
    mine = cores[replica % replicas * share : (replica % replicas + 1) * share]
    os.sched_setaffinity(0, mine)
    if config.model.torch_threads:
        return config
    model = config.model.model_copy(update={"torch_threads": len(mine)})
    return config.model_copy(update={"model": model})
