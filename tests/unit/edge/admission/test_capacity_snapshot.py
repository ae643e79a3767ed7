"""``/v1/capacity`` typed: the gate's snapshot serialises to the documented JSON, and says
what limits admission now (the claim, the prompts' burst, the slack)."""

from __future__ import annotations

import asyncio

from cadenza.config import AdmissionConfig
from cadenza.edge.admission.capacity import CapacityModel, StreamCost
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from tests.support.contract_examples import engine_info as info
from tests.support.contract_examples import stats_message


def _gate() -> AdmissionGate:
    config = AdmissionConfig(unmeasured_factor=1.0)
    capacity = CapacityModel(info(max_num_seqs=8), config)
    return AdmissionGate(config, capacity, ModelMetrics(Metrics(), "cadenza-tiny"))


def test_the_snapshot_serialises_every_documented_field() -> None:
    body = _gate().snapshot().to_json()
    assert set(body) >= {
        "max_streams", "available_now", "active", "queued", "resuming", "kv_pages_total",
        "kv_pages_free", "step_ms_p50", "rtf_headroom", "admission_open", "queues", "limits",
        "claim", "bounds", "step_budget_ms", "step_correction", "realtime_factor", "probes",
        "calibration", "replicas",
    }  # fmt: skip
    assert body["limits"] == {
        "realtime": 8, "kv_memory": body["limits"]["kv_memory"], "max_num_seqs": 8,
        "prefill_burst": body["limits"]["prefill_burst"], "operator": None,
        "arrival_wave": None,
    }  # fmt: skip
    assert body["claim"] == {"held": 8, "evidence": 8, "calibrated": 8}
    assert body["queues"]["realtime"] == {"depth": 0, "oldest_wait_s": 0.0}
    assert body["calibration"]["model"]["decode_points"]
    (replica,) = body["replicas"]
    assert replica["replica"] == 0 and replica["status"] is None and replica["probes"] == 0


def test_available_now_is_what_would_be_admitted_at_once() -> None:
    async def scenario() -> None:
        g = _gate()
        snapshot = g.snapshot()
        assert 0 < snapshot.available_now <= snapshot.max_streams
        assert snapshot.available_now == min(snapshot.max_streams, snapshot.limits.prefill_burst)
        ticket = await g.acquire("realtime", StreamCost(10, 4.0, prompt_tokens=66))
        assert g.snapshot().available_now <= snapshot.available_now
        g.on_engine_stats(stats_message(slack_ms=[1.0]))  # a chunk nearly late: closed
        assert not g.snapshot().admission_open and g.snapshot().available_now == 0
        g.release(ticket)

    asyncio.run(scenario())
