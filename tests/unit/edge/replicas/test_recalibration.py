"""A replica whose engine measured its steps again is priced afresh by admission (a replica
held for a rolling restart stays held); nodes sharing the host's cores are allowed for."""

from __future__ import annotations

import dataclasses

from cadenza.config import load_config
from cadenza.contract.step_time_model import StepTimeModel
from cadenza.edge.admission.shared_rate_limit import quotas_for
from cadenza.edge.replicas.model_service import ModelService
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from tests.support.contract_examples import engine_info


def _service(tmp_path, node_sharers: int = 1) -> ModelService:
    config = load_config(
        overrides={
            "supervision": {"replicas": 2},
            "calibration": {"cache_dir": str(tmp_path)},
        }
    )
    metrics = Metrics()
    return ModelService(
        config,
        ModelMetrics(metrics, config.model.public_name),
        metrics,
        quotas_for(config.limits, metrics),
        None,
        Lifecycle(),
        node_sharers,
    )


def test_a_recalibrated_replica_is_priced_with_its_new_calibration(tmp_path) -> None:
    service = _service(tmp_path)
    conservative = engine_info().calibration
    assert conservative is not None
    conservative = dataclasses.replace(conservative, problems=("attempt 1: busy",))
    for replica in service.replicas:
        replica.info = dataclasses.replace(engine_info(), calibration=conservative)
        service._on_ready(replica)
    first, second = service.replicas
    faster = StepTimeModel.fit(
        [dataclasses.replace(s, ms=s.ms / 4) for s in conservative.samples[:2]], None, 0.0
    )
    measured = dataclasses.replace(conservative, model=faster, problems=())
    before = service.gate.replicas[0].max_streams()
    assert first.info is not None and second.info is not None
    first.info = dataclasses.replace(first.info, calibration=measured)
    service._on_recalibrated(first)
    assert service.gate.replicas[0].step_model == faster
    assert service.gate.replicas[0].max_streams() > before
    assert 0 in service.gate.placeable
    # One held for a rolling restart keeps its pricing and stays held.
    service.gate.hold_replica(1)
    held = service.gate.replicas[1]
    second.info = dataclasses.replace(second.info, calibration=measured)
    service._on_recalibrated(second)
    assert service.gate.replicas[1] is held and 1 not in service.gate.placeable


def test_nodes_sharing_the_cores_count_as_sharers(tmp_path, monkeypatch) -> None:
    from cadenza.edge.replicas import model_service

    monkeypatch.setattr(model_service, "usable_cores", lambda: [0, 1])
    alone, crowded = _service(tmp_path), _service(tmp_path, node_sharers=3)
    for service in (alone, crowded):
        service.replicas[0].info = engine_info()
        service._on_ready(service.replicas[0])
    assert alone.gate.replicas[0].core_sharers == 1  # two replicas, a core each
    assert crowded.gate.replicas[0].core_sharers == 3
