"""Every source module has a test module named after it (``test_<module>.py`` somewhere under
``tests/``) or is listed below with the tests that cover it and why it has none of its own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COVERED_ELSEWHERE: dict[str, tuple[str, str]] = {
    "cadenza/edge/server/client_token_route.py": (
        "tests/integration/test_client_tokens.py",
        "a route, driven against a real server with the tokens it mints",
    ),
    "cadenza/edge/server/socket_peer.py": (
        "tests/integration/test_client_tokens.py",
        "what the admin routes judge by, checked through a real server and a forged header",
    ),
    # module: (covering test module, why there is no test of its own)
    "cadenza/bench/codec_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/engine_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/cpu_precision.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/csm_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/dia_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/pocket_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/engine/models/guidance_branches.py": (
        "tests/unit/engine/test_dia.py",
        "both guidance branches' paged attention, held to transformers through Dia and MusicGen",
    ),
    "cadenza/engine/models/musicgen_checkpoint.py": (
        "tests/unit/engine/test_musicgen.py",
        "the family's loader, tested with the model it loads against transformers",
    ),
    "cadenza/engine/models/t5_encoder.py": (
        "tests/unit/engine/test_musicgen.py",
        "MusicGen's text encoder, held to transformers' T5EncoderModel there",
    ),
    "cadenza/engine/models/stream_state.py": (
        "tests/unit/engine/test_dia.py",
        "the per-stream state's types, exercised by the stateful models that make them",
    ),
    "cadenza/codecs/pretrained_codec.py": (
        "tests/unit/codecs/test_encodec.py",
        "the strict loader of EnCodec and Mimi directories, tested through both (and test_mimi)",
    ),
    "cadenza/codecs/prefixed_weights.py": (
        "tests/unit/codecs/test_embedded_encodec.py",
        "the embedded codecs' weights, read through both loaders (and test_mimi)",
    ),
    "cadenza/codecs/shared_stages.py": (
        "tests/unit/codecs/test_encodec_streaming.py",
        "the stages the streaming decoders share, tested through them (EnCodec, Mimi, SNAC, DAC)",
    ),
    "cadenza/bench/pacing.py": ("tests/integration/test_webrtc.py", "a benchmark"),
    "cadenza/bench/roofline.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/snac_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/cli/generate.py": ("tests/integration/test_cli.py", "a command, run as one"),
    "cadenza/bench/bark_throughput.py": ("tests/integration/test_bench.py", "a benchmark"),
    "cadenza/bench/random_bark.py": (
        "tests/unit/engine/bark/test_bark_model.py",
        "the checkpoints every Bark test loads, and transformers loads them too",
    ),
    "cadenza/engine/models/bark/bark_family.py": (
        "tests/unit/engine/bark/test_bark_checkpoint.py",
        "Bark's registry record, loaded through the registry beside its loader",
    ),
    "cadenza/engine/models/bark/bark_gpt.py": (
        "tests/unit/engine/bark/test_bark_model.py",
        "the stages' weights, run by the engine's step and checked against transformers",
    ),
    "cadenza/engine/models/bark/bark_stream.py": (
        "tests/unit/engine/bark/test_bark_model.py",
        "a stream's progress through the stages, checked through the streams it carries",
    ),
    "cadenza/engine/models/bark/bark_layout.py": (
        "tests/unit/engine/bark/test_bark_model.py",
        "Bark's layout, checked frame by frame against transformers through the engine",
    ),
    "cadenza/cli/options.py": ("tests/unit/test_old_keys.py", "the flags, and the old flag"),
    "cadenza/cli/serve.py": ("tests/integration/test_cli.py", "a command, run as one"),
    "cadenza/client/sdk.py": ("tests/integration/test_websocket.py", "the SDK is the client"),
    "cadenza/codecs/codec.py": ("tests/unit/codecs/test_encodec.py", "protocols only"),
    "cadenza/edge/server/model_metrics.py": (
        "tests/unit/edge/admission/test_gate.py",
        "each model's metrics, read through the gate and the replicas that set them",
    ),
    "cadenza/edge/admission/ticket.py": (
        "tests/unit/edge/admission/test_gate.py",
        "what the gate hands out, tested with it",
    ),
    "cadenza/edge/streams/admission_sequence.py": (
        "tests/unit/edge/streams/test_lease.py",
        "the admission sequence, tested with the leases it opens",
    ),
    "cadenza/edge/streams/utterance_opening.py": (
        "tests/integration/test_text_stream.py",
        "every WebSocket and WebRTC speak opens through it (and test_websocket, test_webrtc)",
    ),
    "cadenza/edge/transports/paced_track.py": (
        "tests/integration/test_webrtc.py",
        "the track a real aiortc peer receives, frame by frame on the clock",
    ),
    "cadenza/edge/transports/ws_payloads.py": (
        "tests/integration/test_websocket.py",
        "every format's payloads, counted and decoded by the SDK",
    ),
    "cadenza/edge/admission/placement.py": (
        "tests/unit/edge/admission/test_gate.py",
        "the gate places every stream through it (headroom, prefix, fewest, prefill wait)",
    ),
    "cadenza/edge/admission/capacity_report.py": (
        "tests/unit/edge/admission/test_capacity_snapshot.py",
        "the snapshot the gate reports",
    ),
    "cadenza/engine/realtime/calibration_cache.py": (
        "tests/unit/engine/realtime/test_calibration.py",
        "the cache key and the cache, as a calibration is loaded or measured",
    ),
    "cadenza/engine/models/audio_declaration.py": (
        "tests/unit/engine/test_llama_checkpoints.py",
        "declarations are read as the Llama and Orpheus families load (and test_orpheus)",
    ),
    "cadenza/engine/models/csm_checkpoint.py": ("tests/unit/engine/test_csm.py", "CSM's loader"),
    "cadenza/engine/models/family.py": ("tests/unit/engine/test_registry.py", "a record"),
    "cadenza/engine/models/llama_checkpoint.py": (
        "tests/unit/engine/test_llama_checkpoints.py",
        "the Llama family's loader",
    ),
    "cadenza/kernels/fusable_decoder.py": (
        "tests/kernels/test_fused_cpu_decode.py",
        "protocols only",
    ),
    "cadenza/edge/replicas/model_service.py": ("tests/integration/test_models.py", "needs engines"),
    "cadenza/edge/replicas/replica.py": ("tests/integration/test_availability.py", "needs engines"),
    "cadenza/edge/server/draining_server.py": (
        "tests/integration/test_drain.py",
        "signals a process",
    ),
    "cadenza/edge/streams/sampling_fields.py": (
        "tests/unit/edge/transports/test_speech_http.py",
        "checked through the speech request and the speak message",
    ),
    "cadenza/codecs/slot_decoder.py": ("tests/unit/codecs/test_snac.py", "a base class"),
    "cadenza/codecs/snac_streaming.py": ("tests/unit/codecs/test_snac.py", "against offline"),
    "cadenza/engine/models/prompt_format.py": (
        "tests/unit/engine/test_orpheus.py",
        "checked through the prompts models build",
    ),
    "cadenza/config/admission.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/cpu.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/limits.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/loading.py": ("tests/unit/test_config.py", "load_config"),
    "cadenza/config/model.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/realtime.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/section.py": ("tests/unit/test_config.py", "a base class"),
    "cadenza/config/server.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/sources.py": ("tests/unit/test_config.py", "the environment"),
    "cadenza/config/supervision.py": ("tests/unit/test_config.py", "a section"),
    "cadenza/config/tree.py": ("tests/unit/test_config.py", "the tree"),
    "cadenza/contract/engine_info.py": ("tests/unit/contract/test_messages.py", "a dataclass"),
    "cadenza/contract/engine_stats.py": ("tests/unit/contract/test_messages.py", "dataclasses"),
    "cadenza/contract/errors.py": ("tests/unit/edge/streams/test_lease.py", "exception types"),
    "cadenza/contract/request.py": ("tests/unit/contract/test_messages.py", "dataclasses"),
    "cadenza/edge/admission/priority_queues.py": (
        "tests/unit/edge/admission/test_gate.py",
        "the gate's ordering is the queues' ordering",
    ),
    "cadenza/edge/server/app.py": (
        "tests/integration/test_http_server.py",
        "routes over real HTTP",
    ),
    "cadenza/edge/streams/errors.py": (
        "tests/unit/edge/transports/test_speech_http.py",
        "rendered by routes",
    ),
    "cadenza/edge/transports/http_protocol.py": (
        "tests/integration/test_edge_robustness.py",
        "a socket protocol: checked with raw sockets against the server",
    ),
    "cadenza/edge/media/opus.py": ("tests/unit/edge/media/test_containers.py", "codec glue"),
    "cadenza/edge/media/resampler.py": ("tests/unit/edge/media/test_containers.py", "glue"),
    "cadenza/edge/media/tempo.py": ("tests/unit/edge/media/test_containers.py", "glue"),
    "cadenza/edge/server/metrics.py": ("tests/integration/test_transport_parity.py", "counters"),
    "cadenza/edge/server/state.py": ("tests/integration/test_api_keys.py", "handler wiring"),
    "cadenza/engine/device.py": ("tests/unit/engine/test_builder.py", "device helpers"),
    "cadenza/engine/identity.py": ("tests/unit/engine/test_builder.py", "one description"),
    "cadenza/engine/layouts/flat.py": ("tests/unit/engine/test_llama_checkpoints.py", "layout"),
    "cadenza/engine/layouts/token_layout.py": (
        "tests/unit/engine/test_scheduler.py",
        "the protocol and the plain layout, driven through the scheduler",
    ),
    "cadenza/engine/models/byte_tokenizer.py": (
        "tests/unit/engine/test_cadenza_tiny.py",
        "two lines of UTF-8",
    ),
    "cadenza/engine/models/checkpoint.py": ("tests/unit/engine/test_llama_checkpoints.py", "-"),
    "cadenza/engine/models/llama.py": ("tests/unit/engine/test_llama_exactness.py", "-"),
    "cadenza/engine/models/llama_causal_lm.py": (
        "tests/unit/engine/test_llama_exactness.py",
        "checked token for token against transformers",
    ),
    "cadenza/engine/models/model.py": ("tests/unit/engine/test_model_runner.py", "a base"),
    "cadenza/engine/models/serving_weights.py": (
        "tests/unit/engine/test_cadenza_tiny.py",
        "the served (fused, packed) model equals the reference one",
    ),
    "cadenza/engine/offline.py": ("tests/unit/engine/test_engine.py", "Engine's offline API"),
    "cadenza/engine/realtime/playout_clock.py": (
        "tests/unit/engine/realtime/test_deadline_policy.py",
        "the clock and its policy",
    ),
    "cadenza/engine/sequence.py": ("tests/unit/engine/test_scheduler.py", "request state"),
    "cadenza/engine/serving_engine.py": ("tests/unit/engine/test_naive_engine.py", "a protocol"),
    "cadenza/config/ice_server.py": ("tests/unit/edge/transports/test_webrtc_ice.py", "-"),
    "cadenza/kernels/attention_context.py": ("tests/unit/engine/test_model_runner.py", "-"),
    "cadenza/kernels/linear_swap.py": ("tests/kernels/test_int8_linear.py", "one function"),
    "cadenza/kernels/triton_decode_attention.py": (
        "tests/kernels/test_decode_attention.py",
        "the public dispatch's Triton half",
    ),
    "cadenza/kernels/triton_int8_linear.py": ("tests/kernels/test_int8_linear.py", "-"),
    "cadenza/kernels/triton_support.py": (
        "tests/kernels/test_attention_backends.py",
        "two predicates, checked through the backend each device gets",
    ),
    "cadenza/loadtest/clients.py": ("tests/integration/test_loadtest.py", "real clients"),
    "cadenza/loadtest/level_runner.py": ("tests/integration/test_loadtest.py", "-"),
    "cadenza/loadtest/level_summary.py": ("tests/unit/loadtest/test_playout.py", "-"),
    "cadenza/loadtest/report.py": ("tests/integration/test_loadtest.py", "the outputs"),
    "cadenza/loadtest/server_metrics.py": ("tests/integration/test_loadtest.py", "-"),
    "cadenza/loadtest/sweep.py": ("tests/integration/test_loadtest.py", "-"),
    "cadenza/loadtest/workload.py": ("tests/integration/test_loadtest.py", "options"),
    "cadenza/logs.py": ("tests/integration/test_edge_robustness.py", "the log is read"),
    "cadenza/version.py": ("tests/unit/edge/test_edge_imports.py", "one constant"),
}


def _modules() -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "cadenza").rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def test_every_module_has_tests() -> None:
    test_names = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    missing = [
        module
        for module in _modules()
        if f"test_{Path(module).stem}.py" not in test_names and module not in COVERED_ELSEWHERE
    ]
    assert not missing, f"modules without tests (write them, or list them): {missing}"


def test_the_list_names_real_modules_and_tests() -> None:
    modules = set(_modules())
    for module, (covering, _why) in COVERED_ELSEWHERE.items():
        assert module in modules, f"{module} no longer exists"
        assert (ROOT / covering).is_file(), f"{covering} (for {module}) does not exist"
        name = Path(module).stem
        assert f"test_{name}.py" not in {p.name for p in (ROOT / "tests").rglob("test_*.py")}, (
            f"{module} has its own test module now: drop it from the list"
        )
