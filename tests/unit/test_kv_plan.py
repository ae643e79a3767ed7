import json
import os
import subprocess
import sys

import pytest

from cadenza.contract.cpu_replicas import default_replicas
from cadenza.engine.kv.paged_kv_cache import KVSpec
from cadenza.engine.models.cadenza_tiny import CadenzaTinySpec
from cadenza.kv_plan import KVPlan, parse_bytes

LLAMA3_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "kv_dtype": "bf16", "context": 8192}


def test_llama3_8b_needs_128_kib_per_token_and_1_gib_per_sequence():
    plan = KVPlan(**LLAMA3_8B, heads=32)
    assert plan.kv_bytes_per_token == 131_072
    assert plan.kv_bytes_per_sequence == 2**30
    result = plan.to_dict()
    assert result["mha_to_gqa_ratio"] == 4
    assert result["mha_kv_bytes_per_token"] == 4 * 131_072


def test_memory_budget_and_batch():
    plan = KVPlan(**LLAMA3_8B, memory_bytes=80 * 2**30, weights_bytes=16 * 2**30, batch=65)
    result = plan.to_dict()
    assert result["sequences_that_fit"] == 64
    assert result["batch_fits"] is False


def test_int8_counts_its_scales_and_halves_fp16():
    fp16 = KVPlan(**{**LLAMA3_8B, "kv_dtype": "fp16"})
    int8 = KVPlan(**{**LLAMA3_8B, "kv_dtype": "int8"})
    assert int8.kv_bytes_per_token == fp16.kv_bytes_per_token // 2 + 2 * 32 * 8 * 2


def test_agrees_with_the_engine_cache_for_cadenza_tiny():
    import torch

    backbone = CadenzaTinySpec().backbone
    plan = KVPlan(backbone.num_layers, backbone.num_kv_heads, backbone.head_dim, "fp32", 1)
    spec = KVSpec(backbone.num_layers, backbone.num_kv_heads, backbone.head_dim)
    assert plan.kv_bytes_per_token == spec.bytes_per_token(torch.float32) == 8192


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24GiB", 24 * 2**30), ("512 MiB", 512 * 2**20), ("1e9", 10**9), ("80GB", 80 * 10**9)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5GB", "12 parsecs", "0"])
def test_parse_bytes_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize(
    "change",
    [{"layers": 0}, {"kv_dtype": "fp4"}, {"context": -1}, {"heads": 12}, {"batch": 0}],
)
def test_invalid_plans(change):
    with pytest.raises(ValueError):
        KVPlan(**{**LLAMA3_8B, **change})


def _plan(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "cadenza", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_cli_json_and_errors():
    result = _plan(
        "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--context", "8192", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kv_bytes_per_token"] == 131_072 and data["kv_bytes_per_sequence"] == 2**30
    tiny = json.loads(
        _plan(
            "--model", "cadenza-tiny", "--kv-dtype", "fp32", "--context", "10", "--json",
            "--no-measure",
        ).stdout
    )  # fmt: skip
    assert "realtime" not in tiny
    assert tiny["kv_bytes_per_token"] == 8192 and tiny["mha_to_gqa_ratio"] == 2
    missing = _plan("--layers", "32", "--context", "10")
    assert missing.returncode == 2 and "--kv-heads" in missing.stderr
    garbage = _plan("--model", "cadenza-tiny", "--context", "10", "--memory", "lots")
    assert garbage.returncode == 2 and "size" in garbage.stderr
    for args in (("--layers", "32", "--kv-heads", "8", "--head-dim", "128"),
                 ("--model", "cadenza-tiny", "--no-measure")):  # fmt: skip
        unsized = _plan(*args)
        assert unsized.returncode == 2 and "give --context" in unsized.stderr


def test_cli_with_a_model_measures_its_real_time_capacity_here(tmp_path):
    quick_sweep = {
        "CADENZA_CALIBRATION__BATCH_SIZES": "[1, 2, 4]",
        "CADENZA_CALIBRATION__DURATION_MS": "200",
        "CADENZA_CALIBRATION__LONG_CONTEXT_TOKENS": "0",
        "CADENZA_CALIBRATION__CACHE_DIR": str(tmp_path),
    }
    result = _plan("--model", "cadenza-tiny", "--context", "100", "--json", env=quick_sweep)
    assert result.returncode == 0, result.stderr
    realtime = json.loads(result.stdout)["realtime"]
    assert realtime["calibration"] == "measured"
    # The sweep stops early once a point costs twice the step budget (a slow machine).
    assert {"1", "2"} <= set(realtime["decode_step_ms"]) <= {"1", "2", "4"}
    # Measured as the server's first replica, counted for as many as the server starts.
    assert realtime["replicas"] == default_replicas("auto", "process")
    assert 1 <= realtime["max_streams_per_replica"] <= 64
    assert realtime["max_streams"] == realtime["replicas"] * realtime["max_streams_per_replica"]
    assert realtime["step_budget_ms"] < 1000 / 75
    assert "float32 logits" in realtime["precision"]  # what it computes in, said
    # Without --context: the nominal stream's (its prompt and 10 s at 75 frames a second).
    again = json.loads(_plan("--model", "cadenza-tiny", "--json", env=quick_sweep).stdout)
    assert again["realtime"]["calibration"] == "cache"
    assert again["context"] > 750
