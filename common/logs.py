"""One logging set-up for both servers: `json` (one object a line) or `text`, on stderr.

Guarantee: a line about a session carries `session`, `fence` and `host` as fields (`session_fields`),
so a log search for one session finds all of it across replicas and agents. Callers pass only
vetted fields: spawn tokens, grant secrets and environment contents are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


def session_fields(session: str, fence: int, host: str, **more: Any) -> dict[str, Any]:
    return {"session": session, "fence": fence, "host": host, **more}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(time.time(), 3), "level": record.levelname.lower(), "logger": record.name,
                 "msg": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = getattr(record, "fields", {})
        return line + "".join(f" {k}={v}" for k, v in extra.items())


def setup(log_format: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger("holdfast")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
