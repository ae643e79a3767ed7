"""``[admission]``: the priority queues and the capacity check in front of the engines
(``edge/admission/``; docs/capacity.md)."""

from __future__ import annotations

from pydantic import Field

from cadenza.config.section import Section


class AdmissionConfig(Section):
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
    max_streams: int | None = Field(
        None,
        ge=1,
        description="a cap on the streams each model admits on this node at once, below what "
        "the node measures it holds (unset: the measured capacity alone); /v1/capacity and "
        "the HAProxy agent check count it",
    )
    wave_headroom: float = Field(
        1.25,
        ge=1.0,
        description="streams that start together are held to the measured waves at the "
        "realtime factor times this: a wave arrives with its clients' handshakes and first "
        "messages on the same cores, which the steady steps the factor measures do not carry "
        "(docs/capacity.md, 'Arrival waves')",
    )
    claim_growth: float = Field(
        1.1,
        ge=1.0,
        description="above the claim at the serving floor, the claim rises to at most this "
        "many times the most streams the replica served at once in the last "
        "jitter_window_s: evidence measured at B streams vouches for a little more than B, "
        "not for what a faster factor extrapolates to (docs/capacity.md, 'The climb under "
        "load')",
    )
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
