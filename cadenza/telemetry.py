"""Prometheus metrics of the edge process, and structured (JSON lines) logging for both
processes. The engine reports its step times to the edge in ``stats`` messages, so one
``/metrics`` endpoint shows both sides."""

from __future__ import annotations

import json
import logging
import sys
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
_STEP_BUCKETS_S = (0.001, 0.002, 0.004, 0.008, 0.0133, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


class Metrics:
    """All server metrics, on a registry of their own (one per app, so tests can build many)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "cadenza_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.streams_active = Gauge(
            "cadenza_streams_active", "streams currently producing audio", registry=r
        )
        self.streams_finished = Counter(
            "cadenza_streams_finished", "streams ended, by reason", ["reason"], registry=r
        )
        self.time_to_first_audio = Histogram(
            "cadenza_time_to_first_audio_seconds",
            "request accepted to first audio chunk from the engine",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.audio_seconds = Counter(
            "cadenza_audio_seconds", "seconds of audio generated", registry=r
        )
        self.engine_step = Histogram(
            "cadenza_engine_step_seconds",
            "engine step time",
            buckets=_STEP_BUCKETS_S,
            registry=r,
        )
        self.engine_requests = Gauge(
            "cadenza_engine_requests",
            "requests held by the engine (running + waiting)",
            registry=r,
        )
        self.engine_ready = Gauge(
            "cadenza_engine_ready", "1 while the engine is loaded and answering", registry=r
        )


class JsonLogFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "process": self.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, process: str) -> None:
    """JSON lines on stderr for the ``cadenza`` loggers, tagged with the process role."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter(process))
    logger = logging.getLogger("cadenza")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
