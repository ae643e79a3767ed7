"""One typed configuration tree for the whole server.

Values come from, highest priority first: command-line flags, ``CADENZA_*`` environment
variables (nested keys joined with ``__``, e.g. ``CADENZA_SERVER__PORT=8001``), an optional TOML
file (``--config FILE``), then the defaults below. Unknown keys are an error, so a typo in a
file or variable name never passes silently.

The tree is plain data: the edge process hands it to the engine process as JSON.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

ENV_PREFIX = "CADENZA_"
CHUNK_FRAME_RATE = 75.0
"""The frame rate ``engine.chunk_frames`` and ``engine.first_chunk_frames`` are counted in
(EnCodec 24 kHz): a codec of another rate gets the same durations in its own frames."""
ENV_NESTED_DELIMITER = "__"


class ConfigError(ValueError):
    """The configuration (file, environment or flags) is invalid; the message says where."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    """The edge process: where it listens and how it logs."""

    host: str = Field("127.0.0.1", description="address the HTTP server binds to")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one)")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="log level of the edge and engine processes"
    )
    gc_freeze: bool = Field(
        True,
        description="once loaded, the edge and engine processes keep what they loaded out of "
        "the garbage collector's walks (gc.freeze): a full collection otherwise stalls every "
        "stream of the process for 50-250 ms (cadenza/gc_pauses.py)",
    )
    api_keys_file: str | None = Field(
        None, description="file of accepted API keys (one per line, or sha256:<hex>); unset: open"
    )
    max_queued_chunks: int = Field(
        256, ge=1, description="audio chunks one stream may have waiting for its client"
    )
    ws_idle_timeout_s: float = Field(
        60.0, gt=0, description="close a WebSocket that sends nothing and streams nothing"
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="drop a client (WebSocket or HTTP) whose connection takes no data for this "
        "long; its stream's slot is freed at once",
    )
    send_buffer_bytes: int = Field(
        262144,
        ge=0,
        description="socket send buffer per connection (0: the kernel's, which grows to MBs "
        "and hides a client that stopped reading for minutes)",
    )
    request_head_timeout_s: float = Field(
        10.0, gt=0, description="close a connection whose request line and headers take longer"
    )
    request_body_timeout_s: float = Field(
        10.0, gt=0, description="refuse a request whose body stalls for this long (408)"
    )
    jitter_reserve_ms: int = Field(
        100, ge=0, le=2000, description="audio buffered before a WebRTC utterance starts playing"
    )
    webrtc_connect_timeout_s: float = Field(
        30.0, gt=0, description="close a WebRTC peer that has not connected by then"
    )
    max_pending_webrtc_offers: int = Field(
        32, ge=1, description="WebRTC peers waiting to connect at once; more offers get 503"
    )
    ws_max_message_bytes: int = Field(
        65536, ge=1024, description="largest WebSocket message a client may send"
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM or POST /admin/drain: how long open streams may run on before "
        "they are ended with shutting_down (and, for a rolling restart, per replica)",
    )
    resume_timeout_s: float = Field(
        30.0,
        ge=0,
        description="how long a stream whose engine was lost may wait for a replica to resume "
        "it on (0: never resume; the stream fails with engine_unavailable)",
    )


class ModelConfig(_Section):
    """Which model the engine serves and on what device."""

    name: str = Field(
        "cadenza-tiny",
        description="a built-in model name, a local checkpoint directory, or a hub id "
        "(owner/name) in the local Hugging Face cache",
    )
    codec: str | None = Field(
        None,
        description="the codec to decode with instead of the one the model names (a built-in "
        "name: encodec_24khz, snac_24khz; a directory; or a hub id in the local cache)",
    )
    codec_noise: bool = Field(
        True, description="SNAC's noise layers (off: reproducible audio for the same tokens)"
    )
    served_name: str | None = Field(
        None, description="the name clients ask for this model by (default: name)"
    )

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks cuda when available, else cpu"
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="weight and activation dtype (auto: float32 on cpu, bfloat16 on cuda). "
        "Named, it is the dtype of every product and of the KV cache; auto lets the engine "
        "lower products, KV cache and codec where measured, and says so (docs/precision.md)",
    )
    seed: int = Field(0, description="seed that builds the weights of built-in random models")
    weights_dtype: Literal["auto", "int8"] = Field(
        "auto",
        description="int8: weight-only int8 linears with per-output-channel scales (W8A16)",
    )
    torch_threads: int = Field(
        0, ge=0, description="intra-op threads for torch in the engine (0: torch's default)"
    )

    @property
    def public_name(self) -> str:
        return self.served_name or self.name


class ServedModel(_Section):
    """One ``[[models]]`` entry: a model this server serves, in its own engine process."""

    name: str = Field(min_length=1, max_length=128, description="the name clients use")
    path: str = Field(min_length=1, description="built-in name, checkpoint directory or hub id")
    codec: str | None = Field(None, description="codec instead of the one the model names")


class EngineConfig(_Section):
    """The engine process and how the edge talks to it."""

    kind: Literal["cadenza", "naive"] = Field(
        "cadenza",
        description="cadenza: the batching engine; naive: one thread per request with the "
        "transformers model and offline codec decode (a baseline for load tests)",
    )
    mode: Literal["process", "inprocess"] = Field(
        "process",
        description="process: engine in its own process over ZeroMQ; inprocess: a thread (tests)",
    )
    chunk_frames: int = Field(
        15,
        ge=1,
        le=750,
        description="audio per chunk sent to the edge, in 75 Hz codec frames (13.3 ms); a "
        "codec at another frame rate gets the nearest whole number of its own frames (>= 1)",
    )
    first_chunk_frames: int = Field(
        8,
        ge=1,
        le=750,
        description="audio in a stream's first chunk (small: fast TTFA), in 75 Hz codec "
        "frames, converted like chunk_frames, plus the frames a codec looks ahead (SNAC: 3)",
    )
    startup_timeout_s: float = Field(
        180.0, gt=0, description="how long the edge waits for the engine to load"
    )
    replicas: int | None = Field(
        None,
        ge=1,
        le=64,
        description="engine processes per model, each with its own KV pool and calibration "
        "(on a machine with several GPUs and device cuda: one per device, round robin; on a "
        "CPU each pinned to its share of the cores); unset: one per core on a CPU-only "
        "machine with at most 2 cores (measured: twice the streams of one replica on both), "
        "else one",
    )
    warm_spare: bool = Field(
        False,
        description="keep one more engine per replica loaded and idle, which replaces a lost "
        "engine at once (its streams resume within their prefill, not a process start); costs "
        "that engine's memory (its weights and KV pool) per replica",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0,
        description="an engine that sends nothing for this long is hung: it is killed, its "
        "streams resume elsewhere and it is restarted",
    )
    restart_backoff_s: float = Field(
        0.5, ge=0, description="wait before restarting a lost engine; doubles per failed start"
    )
    restart_backoff_max_s: float = Field(
        30.0, ge=0, description="the longest wait between restarts of a lost engine"
    )
    max_start_failures: int = Field(
        5,
        ge=1,
        description="starts in a row that may fail (crash or time out before ready) before "
        "the engine is no longer restarted and /readyz says why",
    )
    resume_replay_frames: int = Field(
        750,
        ge=0,
        description="codec frames a resumed stream's decoder is fed, unheard, to rebuild its "
        "state (its last ones; a longer stream's audio after the gap is then near, not equal)",
    )
    max_pending_requests: int = Field(
        256, ge=1, description="requests the engine holds (running + waiting) before refusing"
    )
    page_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    kv_dtype: Literal["auto", "fp32", "fp16", "bf16", "int8"] = Field(
        "auto",
        description="KV cache dtype (auto: the model's, except bf16 where a float32 model's "
        "steps run fused on the CPU with bf16 products and model.dtype is auto; int8: "
        "per-token-per-head scales, "
        "about twice the tokens of fp16 per byte)",
    )
    max_num_batched_tokens: int = Field(
        512, ge=1, description="token budget of one engine step (decodes + prefill chunks)"
    )
    max_num_seqs: int = Field(64, ge=1, description="most sequences running at once")
    enable_prefix_caching: bool = Field(True, description="share KV pages of equal prefixes")
    reserve_max_output: bool = Field(
        True,
        description="admit a stream only with KV pages for its whole output (no preemption)",
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="KV cache size in bytes (unset: a fraction of free memory)"
    )
    pack_cpu_weights: bool = Field(
        True, description="prepack fp32 linear weights for oneDNN on the CPU (faster decode)"
    )
    cpu_linear_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype the CPU's prepacked linears multiply in (weights stay fp32): "
        "auto is bfloat16 where the CPU has native bf16 matrix units (AMX or AVX512-BF16) and "
        "model.dtype is auto, else float32; output heads give float32 logits either way "
        "(docs/precision.md)",
    )
    fused_cpu_decode: bool = Field(
        True,
        description="on the CPU, run Llama backbones' steps through the native kernel "
        "(compiled once per machine with the system's C++ compiler; without one, or with "
        "int8 weights or an fp16 or int8 KV cache, steps stay on torch)",
    )
    codec_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype the streaming codec decoder computes in on the CPU: auto is "
        "bfloat16 where the CPU has native bf16 matrix units, the codec supports it "
        "(EnCodec) and model.dtype is auto, else float32 (always float32 on a GPU)",
    )
    kv_cache_memory_fraction: float = Field(
        0.05,
        gt=0,
        le=0.95,
        description="share of free device memory for the KV cache (raise it on a GPU)",
    )

    ttfa_target_ms: float = Field(
        300.0, gt=0, description="a stream's first chunk is due this long after it arrives"
    )
    playout_reserve_ms: float = Field(
        100.0,
        ge=0,
        description="audio a listener buffers before playing; later chunks are due against it",
    )
    prompt_ttfa_multiple: float = Field(
        12.0,
        ge=0,
        description="a prompt longer than the nominal (64-character) one has its first chunk "
        "due later than ttfa_target_ms by this many times what its extra rows take to prefill "
        "alone (so this many long prompts arriving together all start on time, and shorter "
        "prompts, due sooner, are prefilled first); 0: every first chunk is due at the target",
    )
    max_lead_ms: float = Field(
        1500.0,
        gt=0,
        description="how far ahead of its listener a stream is generated: when every stream "
        "is further ahead, the engine waits and leaves the CPU to the edge",
    )
    lead_hysteresis_ms: float = Field(
        300.0,
        ge=0,
        description="once every stream is max_lead_ms ahead, the engine rests until the "
        "least ahead is this much below it, then steps back to back (warm steps in bursts "
        "instead of one cold step per frame)",
    )
    realtime_headroom: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="share of each frame period kept free: steps and admission aim below it",
    )
    calibration: Literal["auto", "refresh", "off"] = Field(
        "auto",
        description="step-time sweep at start-up: auto (cached per model and device), "
        "refresh (measure again), off (no real-time admission)",
    )
    calibration_batch_sizes: tuple[int, ...] = Field(
        (1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64),
        min_length=1,
        description="decoding streams per calibration point (stops once steps are too slow)",
    )
    calibration_steps: int = Field(
        120,
        ge=2,
        le=1000,
        description="audio timed per calibration point, in 75 Hz codec frames (converted like "
        "chunk_frames: 20 frames of a 12.5 Hz codec), a multiple of chunk_frames",
    )
    calibration_long_context: int = Field(
        1024, ge=0, description="prompt tokens of the long-context calibration point (0: none)"
    )
    calibration_attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="sweeps a start may run until one agrees with itself (its repeated "
        "points and its fit; a busy machine's do not); then it serves with a conservative "
        "one, never cached (/readyz and the log say so)",
    )
    calibration_tolerance: float = Field(
        0.5,
        gt=0,
        description="how far a sweep's two measurements of a point (and a larger batch's "
        "step below a smaller one's) may disagree, as a share, before the sweep counts as "
        "taken on a busy machine and is measured again; its segments' slopes are held to "
        "3 x (1 + this) their median, and the engine must have had 1 - 0.7 x this of its "
        "cores' time while it measured",
    )
    calibration_cache_dir: str | None = Field(
        None, description="where calibrations are cached (unset: ~/.cache/cadenza)"
    )

    @model_validator(mode="after")
    def _budget_covers_every_decode(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be at least max_num_seqs, so every running "
                "sequence can decode in every step"
            )
        return self


class LimitsConfig(_Section):
    """Validation limits applied to every request, whatever the transport."""

    max_input_chars: int = Field(4096, ge=1, description="longest text accepted")
    max_duration_s: float = Field(300.0, gt=0, description="longest audio one request may ask for")
    chars_per_second: float = Field(
        14.0, gt=0, description="speaking rate used to derive a request's duration from its text"
    )
    min_duration_s: float = Field(1.0, gt=0, description="shortest derived duration")
    requests_per_minute: float = Field(
        0, ge=0, description="requests one client (API key, or IP when open) may start; 0: any"
    )
    audio_seconds_per_minute: float = Field(
        0, ge=0, description="seconds of audio one client may request per minute; 0: any"
    )
    max_prompt_audio_s: float = Field(
        20.0, gt=0, description="longest speech prompt (microphone audio) a request may carry"
    )
    max_context_s: float = Field(
        120.0,
        gt=0,
        description="conversation sessions keep their most recent turns up to this many "
        "seconds of audio as the next turn's context (older turns are dropped)",
    )


class GuardConfig(_Section):
    """The input-text guard (see ``admission/guard.py``)."""

    policy: str = Field(
        "none", description="none, phrase_list, or python:module:factory (a pluggable guard)"
    )
    phrases_file: str | None = Field(None, description="phrase_list: one refused phrase per line")
    timeout_s: float = Field(0.2, gt=0, description="how long the guard may take per request")
    fail_open: bool = Field(
        False, description="on guard timeout or error: allow (true) or refuse (false)"
    )


class AdmissionConfig(_Section):
    """Priority queues and the capacity check in front of the engine (``admission/``)."""

    realtime_max_wait_s: float = Field(
        0.25,
        ge=0,
        description="longest a realtime request waits for capacity before refusal: its "
        "listener is waiting, so past this its first audio would miss the TTFA target; a "
        "request whose expected wait is longer is refused at once, with Retry-After",
    )
    standard_max_wait_s: float = Field(30.0, ge=0, description="same for standard requests")
    batch_max_wait_s: float = Field(120.0, ge=0, description="same for batch requests")
    max_queue_length: int = Field(64, ge=0, description="requests waiting per priority class")
    aging_s: float = Field(
        10.0, gt=0, description="waiting this long raises a request by one priority class"
    )
    standard_reserved_share: float = Field(
        0.2, ge=0, le=1, description="share of max_streams standard requests get first"
    )
    batch_reserved_share: float = Field(
        0.05, ge=0, le=1, description="share of max_streams batch requests get first"
    )
    nominal_stream_s: float = Field(
        10.0, gt=0, description="utterance length max_streams is quoted for (context, pages)"
    )
    slack_close_ms: float = Field(
        10.0,
        description="close admission while a delivered chunk had less slack than this",
    )
    slack_reopen_s: float = Field(
        1.0, ge=0, description="reopen once chunks have kept that slack for this long"
    )
    jitter_window_s: float = Field(
        30.0,
        gt=0,
        description="admission scales predicted steps by the 90th percentile of how much "
        "slower live steps ran over this window (the calibration's jitter before that)",
    )
    factor_recovery_s: float = Field(
        30.0,
        ge=0,
        description="a slower verdict on the steps counts at once; a faster one only once "
        "the slower verdicts are this old (the claim drops at once and rises slowly: the "
        "machine's speed under load varies by more than one window shows)",
    )
    factor_climb_s: float = Field(
        8.0,
        ge=0,
        description="once a probe on an idle engine has shown a slowdown is over, the "
        "realtime factor the load had measured falls e-fold every this many seconds (the "
        "claim climbs back at a bounded rate; slower evidence still cuts it at once)",
    )
    probe_interval_s: float = Field(
        2.0,
        gt=0,
        description="while a replica's realtime factor is above its serving floor and its "
        "engine is idle, ask it this often for a probe (synthetic decode steps, counted "
        "apart from streams) that measures the machine's speed now",
    )
    probe_max_ms: float = Field(
        400.0,
        gt=0,
        description="the longest a probe runs (it also stops at once when a request arrives)",
    )
    remembered_factor_half_life_s: float = Field(
        3600.0,
        gt=0,
        description="a factor remembered from an earlier server is a hint that ages: its "
        "distance from unmeasured_factor halves every this many seconds since it was measured",
    )
    remembered_factor_cap: float = Field(
        1.25,
        ge=1.0,
        le=10.0,
        description="a remembered factor counts at most this many times unmeasured_factor "
        "(served steps ran 1.1-1.7x their calibration on the 2-core development machine; a "
        "machine busier than that is for probes and live windows to measure, not for a "
        "restart to assume); above 20 or unreadable, it is ignored",
    )
    unmeasured_factor: float | None = Field(
        None,
        ge=1.0,
        le=20.0,
        description="the realtime factor assumed for a calibration no server on this machine "
        "has served with yet (nothing remembered), until live steps replace it (seconds "
        "into the first load): unset, 1.4 where the engine runs on the CPU (the edge and "
        "the clients share its cores; served steps ran 1.1-1.7x their calibration on the "
        "2-core development machine) and the calibration's own jitter elsewhere",
    )


class CadenzaConfig(BaseSettings):
    """The whole configuration. Build it with :func:`load_config`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    limits: LimitsConfig = LimitsConfig()
    guard: GuardConfig = GuardConfig()
    admission: AdmissionConfig = AdmissionConfig()
    models: list[ServedModel] = Field(
        default_factory=list,
        description="several models per server: [[models]] entries (name, path, codec); "
        "empty: the one [model]",
    )

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ServedModel]) -> list[ServedModel]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return models

    def served_models(self) -> list[CadenzaConfig]:
        """One configuration per served model (its ``[model]`` section filled from its
        ``[[models]]`` entry), the first the default; ``[self]`` without entries."""
        if not self.models:
            return [self]
        return [
            self.model_copy(
                update={
                    "model": self.model.model_copy(
                        update={
                            "name": entry.path,
                            "served_name": entry.name,
                            "codec": entry.codec or self.model.codec,
                        }
                    ),
                    "models": [],
                }
            )
            for entry in self.models
        ]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init kwargs) beat the environment; there is no .env or secrets-dir source.
        return init_settings, env_settings


def load_config(
    config_file: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> CadenzaConfig:
    """Build the configuration: ``overrides`` (flags) > environment > ``config_file`` > defaults.

    ``overrides`` is a nested dict such as ``{"server": {"port": 8001}}``; ``None`` values are
    dropped so unset flags do not mask the environment. Raises :class:`ConfigError`.
    """
    file_values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    flag_values = _drop_none(overrides or {})
    try:
        # The environment sits between the file and the flags, so the file's values are
        # applied as defaults underneath a settings object built from env + flags.
        env_and_flags = CadenzaConfig(**flag_values)
        explicit = env_and_flags.model_dump(exclude_unset=True)
        return CadenzaConfig(**_deep_merge(file_values, explicit))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc


def config_reference() -> str:
    """Every configuration key with its environment variable, default and meaning (for --help)."""
    lines = []
    for section_name, section_field in CadenzaConfig.model_fields.items():
        if section_name == "models":
            lines.append(f"  [[models]] (config file only): {section_field.description}")
            continue
        section_type = section_field.annotation
        assert isinstance(section_type, type) and issubclass(section_type, BaseModel)
        for key, field in section_type.model_fields.items():
            env = f"{ENV_PREFIX}{section_name.upper()}{ENV_NESTED_DELIMITER}{key.upper()}"
            lines.append(
                f"  {section_name}.{key} (env {env}, default {field.default!r}): "
                f"{field.description}"
            )
    return "\n".join(lines)


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            nested = _drop_none(value)
            if nested:
                cleaned[key] = nested
        elif value is not None:
            cleaned[key] = value
    return cleaned


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "(root)"
        problems.append(f"{location}: {error['msg']}")
    return "invalid configuration: " + "; ".join(problems)
