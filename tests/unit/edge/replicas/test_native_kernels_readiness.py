"""How the edge shows an engine's native kernels: per replica in ``/readyz`` (a summary line,
each library's status, level and ISA, and why one is off) and a ``/metrics`` gauge per
library, replaced when the replica's engine is replaced."""

from __future__ import annotations

from prometheus_client import generate_latest

from cadenza.contract.native_kernels import NO_COMPILER_NOTE
from cadenza.edge.replicas.model_service import native_kernels_state
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from tests.support.contract_examples import NO_COMPILER_KERNELS, engine_info


def test_readyz_lists_each_loaded_library_with_its_level_and_isa() -> None:
    state = native_kernels_state(engine_info())["native_kernels"]
    assert state["summary"] == "native kernels: 2 of 2 loaded for native (avx512bf16)"
    assert state["libraries"]["cpu_elu"] == {
        "status": "loaded",
        "level": "native",
        "isa": "avx512bf16",
    }


def test_readyz_says_when_there_is_no_compiler() -> None:
    state = native_kernels_state(engine_info(native_kernels=NO_COMPILER_KERNELS))
    kernels = state["native_kernels"]
    assert kernels["summary"] == NO_COMPILER_NOTE
    library = kernels["libraries"]["cpu_decode_layers"]
    assert library["status"] == "no_compiler" and library["isa"] == ""
    assert "c++" in library["detail"]


def test_an_engine_that_reports_no_kernels_adds_nothing() -> None:
    assert native_kernels_state(None) == {}
    assert native_kernels_state(engine_info(native_kernels=())) == {}


def _gauge_lines(metrics: Metrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith("cadenza_native_kernel_loaded{")]


def test_metrics_have_a_gauge_per_library_replaced_with_the_engine() -> None:
    metrics = Metrics()
    model = ModelMetrics(metrics, "cadenza-tiny")
    model.set_native_kernels(0, engine_info().native_kernels)
    lines = _gauge_lines(metrics)
    assert len(lines) == 2 and all(line.endswith(" 1.0") for line in lines)
    assert any(
        'library="cpu_elu"' in line and 'isa="avx512bf16"' in line and 'replica="0"' in line
        for line in lines
    )
    model.set_native_kernels(1, engine_info().native_kernels)
    model.set_native_kernels(0, NO_COMPILER_KERNELS)  # replica 0's new engine has no compiler
    lines = _gauge_lines(metrics)
    replica_0 = [line for line in lines if 'replica="0"' in line]
    assert len(lines) == 4 and len(replica_0) == 2
    assert all('status="no_compiler"' in line and line.endswith(" 0.0") for line in replica_0)
