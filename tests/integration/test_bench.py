"""``cadenza bench``: each benchmark runs end to end at its smallest size and prints its JSON;
bad options are refused clearly. (The numbers themselves live in docs/benchmarks.md.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cadenza.kernels.cpu_linear import bf16_packing_available


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cadenza", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("target", ["engine", "codec", "snac"])
def test_the_smallest_run_prints_side_by_side_results(target) -> None:
    done = _bench(target, "--batch-sizes", "1", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == target and len(result["results"]) == 1
    assert result["results"][0]["speedup"] > 0
    if target == "engine":
        assert result["roofline"]["gemm_gflops_2048"] > 0
    if target == "snac":
        assert result["error_vs_offline"]["cadenza_max_abs"] < 1e-4


@pytest.mark.parametrize("options", [["--batch-sizes", "x"], ["--batch-sizes", "0"]])
def test_bad_options_are_refused(options) -> None:
    done = _bench("codec", *options)
    assert done.returncode == 2 and "cadenza:" in done.stderr


def test_the_precision_run_measures_speed_and_accuracy_of_every_setting() -> None:
    done = _bench("precision", "--batch-sizes", "16", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "precision"
    assert {entry["rows"] for entry in result["linear_us"]} == {16}
    packed = result["backbone_accuracy"]["fp32_packed"]
    assert packed["top1_agreement"] == 1.0  # prepacking alone changes nothing but rounding
    bf16 = result["backbone_accuracy"]["bf16_packed"]
    if bf16_packing_available():
        assert all(entry["bf16_packed"] > 0 for entry in result["linear_us"])
        assert bf16["logits_cosine_min"] > 0.999
    else:  # a setting this CPU cannot run is reported as not run
        assert all(entry["bf16_packed"] is None for entry in result["linear_us"])
        assert bf16 is None
    assert 40.0 < result["codec"]["bf16_snr_db"] < 200.0


def test_the_csm_run_compares_the_engine_transformers_and_mimi_streaming() -> None:
    done = _bench("csm", "--batch-sizes", "1", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "csm" and result["shape"] == "csm-small"
    (entry,) = result["results"]
    assert entry["float32_decode_step_ms"] > 0 and entry["auto_depth_loop_ms"] > 0
    assert result["transformers_frames_per_s_one_request"] > 0
    assert result["mimi"][0]["streaming_audio_s_per_s"] > 0


def test_the_bark_run_compares_batched_streams_with_transformers() -> None:
    done = _bench(
        "bark", "--shape", "bark-tiny", "--batch-sizes", "1,2", "--semantic-tokens", "20", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "bark" and result["shape"] == "bark-tiny"
    for row in result["rows"]:
        audio = {row[name]["audio_s"] for name in ("cadenza", "transformers_one_by_one")}
        assert len(audio) == 1 and audio.pop() > 0  # the same audio length both ways
        assert row["speedup_vs_one_by_one"] > 0
        assert row["cadenza"]["first_audio_s_median"] > 0


def test_bark_shapes_belong_to_bark() -> None:
    done = _bench("bark", "--shape", "csm-small", "--json")
    assert done.returncode == 2 and "not a bark shape" in done.stderr


def test_the_dia_run_compares_guided_streams_with_transformers() -> None:
    done = _bench("dia", "--shape", "dia-tiny", "--batch-sizes", "1,2", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "dia" and result["shape"] == "dia-tiny"
    assert [entry["batch"] for entry in result["results"]] == [1, 2]
    for entry in result["results"]:
        assert entry["transformers_frames_per_s"] > 0 and entry["engine_decode_step_ms"] > 0
        assert entry["engine_over_transformers"] > 0


def test_the_pocket_run_compares_concurrent_streams_with_transformers_one_by_one(
    tmp_path,
) -> None:
    kept = tmp_path / "pocket"
    done = _bench(
        "pocket",
        "--shape",
        "pocket-tiny",
        "--batch-sizes",
        "1,2",
        "--repeats",
        "1",
        "--save-checkpoint",
        str(kept),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "pocket" and result["shape"] == "pocket-tiny"
    assert result["model"]["latent_dim"] == 32 and result["frames"] > 0
    assert [entry["batch"] for entry in result["results"]] == [1, 2]
    for entry in result["results"]:
        assert entry["transformers_with_decode_frames_per_s"] > 0
        assert entry["transformers_frames_per_s"] > entry["transformers_with_decode_frames_per_s"]
        assert entry["engine_decode_step_ms"] > 0 and entry["engine_over_transformers"] > 0
        assert 0 <= entry["engine_codec_share"] < 1
    # The checkpoint it ran is kept, to serve; its tokenizer reads common words whole (a
    # prompt's rows as the released vocabulary counts them), a rare word by its characters.
    from transformers import AutoTokenizer

    assert (kept / "config.json").is_file() and (kept / "audio_tokenizer").is_dir()
    tokenizer = AutoTokenizer.from_pretrained(kept)
    assert tokenizer.tokenize("The river keeps singing") == [
        "▁The",
        "▁river",
        "▁keeps",
        "▁singing",
    ]
    assert tokenizer.tokenize("Zyx") == ["▁Z", "y", "x"]


def test_only_pocket_keeps_its_checkpoint(tmp_path) -> None:
    done = _bench("codec", "--save-checkpoint", str(tmp_path / "x"), "--json")
    assert done.returncode == 2 and "--save-checkpoint" in done.stderr
    assert not (tmp_path / "x").exists()


def test_pocket_shapes_belong_to_pocket() -> None:
    done = _bench("pocket", "--shape", "dia-tiny", "--json")
    assert done.returncode == 2 and "not a pocket shape" in done.stderr
