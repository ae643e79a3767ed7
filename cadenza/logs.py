"""Structured logging for both processes: JSON lines on stderr, tagged with the process role
(``edge`` or ``engine``)."""

from __future__ import annotations

import json
import logging
import sys
import time


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
