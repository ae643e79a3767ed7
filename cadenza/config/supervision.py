"""``[supervision]``: how the edge runs its engine processes, replaces a lost one and resumes
its streams (``edge/replicas/replica.py``, ``edge/replicas/restart_policy.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadenza.config.section import Section


class SupervisionConfig(Section):
    """The engine processes of each model as the edge starts, watches and restarts them."""

    mode: Literal["process", "inprocess"] = Field(
        "process",
        description="process: engine in its own process over ZeroMQ; inprocess: a thread (tests)",
    )
    startup_timeout_s: float = Field(
        180.0,
        gt=0,
        description="how long the edge waits for a starting engine that makes no progress "
        "(it reports what it is doing, loading or calibrating, every second); an engine "
        "still working is waited for however long its calibration takes",
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
    share_host: bool = Field(
        True,
        description="divide this host's cores with the other cadenza nodes running on it "
        "(each node, edge and engines, pinned to its own block of the cores, its replicas "
        "dividing that; with more nodes than cores every node shares every core); false: "
        "run on every core this process may use, as if alone",
    )
    host_registry_dir: str | None = Field(
        None,
        description="where the nodes on one host register (a lock file each, held while the "
        "node runs; share_host); unset: $XDG_RUNTIME_DIR/cadenza/nodes, else "
        "<tmp>/cadenza-<uid>/nodes. Containers on one host share it through a directory "
        "mounted from the host",
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
    resume_replay_ms: float = Field(
        10000.0,
        ge=0,
        le=600000,
        description="audio a resumed stream's decoder is fed, unheard, to rebuild its state "
        "(its last, in the codec's frames, rounded; a longer stream's audio after the gap is "
        "then near, not equal); 0: none",
    )
