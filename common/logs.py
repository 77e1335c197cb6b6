"""One logging set-up for both servers: `json` (one object a line) or `text`, on stderr.

Guarantee: a line about a session carries `session`, `fence` and `host` as fields (`session_fields`),
so a log search for one session finds all of it across replicas and agents. Callers pass only
vetted fields: spawn tokens, grant secrets and environment contents are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
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


def fatal(message: str) -> None:
    """Last words (e.g. a server's address taken): through the handler `setup` installed, so a JSON
    log ends in JSON too; on stderr as they are where logging was not set up."""
    if any(isinstance(h.formatter, (JsonFormatter, TextFormatter)) for h in logging.getLogger().handlers):
        logging.getLogger("holdfast").critical(message)
    else:
        print(message, file=sys.stderr)


def setup(log_format: str = "json", level: str = "info") -> None:
    """A server's stderr, every line through one handler: holdfast's loggers at `level`, any other
    library's (asyncio's "Task exception was never retrieved", grpc's, aetcd's) at warning and up,
    warnings, and an exception nobody caught, in any thread — so a JSON log is one JSON object a
    line, always (a raw CancelledError traceback and library lines broke that)."""
    # Neither format shows a line's source file, thread or process: not looking them up spares every
    # line a walk of the caller's frames and two lookups (a grant and a release each log one).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    ours = logging.getLogger("holdfast")
    ours.handlers[:] = []
    ours.setLevel(level.upper())
    ours.propagate = True
    logging.captureWarnings(True)
    uncaught = logging.getLogger("holdfast.uncaught")
    sys.excepthook = lambda kind, value, tb: uncaught.critical(
        "uncaught %s", kind.__name__, exc_info=(kind, value, tb))
    threading.excepthook = lambda hook: uncaught.critical(
        "uncaught %s in thread %s", hook.exc_type.__name__, hook.thread.name if hook.thread else "?",
        exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback))
    sys.unraisablehook = lambda hook: uncaught.error(
        "%s: %r", hook.err_msg or "exception ignored", hook.object,
        exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback))
