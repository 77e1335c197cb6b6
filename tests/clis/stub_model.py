"""A stub model server for the real agent CLIs, on loopback: Codex's streamed Responses API
(`POST /v1/responses`) and Claude Code's streamed Messages API (`POST /v1/messages`).

Each answer is the text `reply to: <the last user prompt>`. A prompt holding `HOLD` is a turn held
open: the stub sends the stream's first event, appends `held <n>` to its log, and sends the rest
only after a `POST /_release` (one per held turn; or never, when the CLI is ended first — the
mid-turn takeover).

Run as `python stub_model.py READY_FILE LOG_FILE`: it listens on 127.0.0.1 (a free port), writes
`{"port": N}` to READY_FILE once it listens, and appends one JSON line per request to LOG_FILE
(`path`, `prompt`, `stream`), so a test can see what each CLI asked. Guarantee: it binds loopback
only and answers every path it does not know with 404, logged.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOLD = "HOLD"
released = threading.Semaphore(0)  # one release lets one held turn go on
log_lock = threading.Lock()
LOG = Path()
held = 0


def log(entry: dict[str, Any]) -> None:
    with log_lock, LOG.open("a") as out:
        out.write(json.dumps(entry) + "\n")


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or its last part with `text` (Claude Code sends
    its reminders as parts before the prompt)."""
    if isinstance(content, str):
        return content
    parts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)] \
        if isinstance(content, list) else []
    return parts[-1] if parts else ""


def last_prompt(body: dict[str, Any]) -> str:
    """The last user message of a Responses (`input`) or Messages (`messages`) request."""
    turns = body.get("input") or body.get("messages") or []
    if isinstance(turns, str):
        return turns
    users = [t for t in turns if isinstance(t, dict) and t.get("role") == "user"]
    return text_of(users[-1].get("content")) if users else ""


def responses_events(reply: str) -> list[tuple[str, dict[str, Any]]]:
    item = {"type": "message", "id": "msg_stub", "role": "assistant", "status": "in_progress", "content": []}
    done = {**item, "status": "completed",
            "content": [{"type": "output_text", "text": reply, "annotations": []}]}
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2}
    response = {"id": "resp_stub", "object": "response", "status": "in_progress", "output": []}
    return [
        ("response.created", {"type": "response.created", "response": response}),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                        "item": item}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg_stub",
                                        "output_index": 0, "content_index": 0, "delta": reply}),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": done}),
        ("response.completed", {"type": "response.completed",
                                "response": {**response, "status": "completed", "output": [done],
                                             "usage": usage}}),
    ]


def messages_events(reply: str, model: str) -> list[tuple[str, dict[str, Any]]]:
    message = {"id": "msg_stub", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": reply}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 1},
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None}}),
        ("message_stop", {"type": "message_stop"}),
    ]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # every request is logged as JSON instead

    def do_GET(self) -> None:
        log({"method": "GET", "path": self.path})
        self.send_error(404)

    def do_HEAD(self) -> None:
        log({"method": "HEAD", "path": self.path})
        self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if path == "/_release":
            released.release()
            self._plain(200, b"released\n")
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        prompt = last_prompt(body) if isinstance(body, dict) else ""
        stream = bool(body.get("stream")) if isinstance(body, dict) else False
        log({"method": "POST", "path": path, "prompt": prompt, "stream": stream})
        reply = f"reply to: {prompt.strip()[-200:]}"
        if path.endswith("/responses"):
            self._stream(responses_events(reply), prompt)
        elif path.endswith("/messages/count_tokens"):
            self._json({"input_tokens": 1})
        elif path.endswith("/messages") and stream:
            self._stream(messages_events(reply, str(body.get("model", "stub"))), prompt)
        elif path.endswith("/messages"):
            self._json({"id": "msg_stub", "type": "message", "role": "assistant",
                        "model": str(body.get("model", "stub")), "content": [{"type": "text", "text": reply}],
                        "stop_reason": "end_turn", "stop_sequence": None,
                        "usage": {"input_tokens": 1, "output_tokens": 1}})
        else:
            self.send_error(404)

    def _plain(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[tuple[str, dict[str, Any]]], prompt: str) -> None:
        global held
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for n, (name, data) in enumerate(events):
                self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                if n == 0 and HOLD in prompt:
                    with log_lock:
                        held += 1
                        number = held
                    log({"held": number, "prompt": prompt})
                    released.acquire()
        except (BrokenPipeError, ConnectionResetError):
            log({"gone": prompt})  # the CLI ended mid-turn


def main() -> None:
    global LOG
    ready, LOG = Path(sys.argv[1]), Path(sys.argv[2])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    partial = ready.with_name(ready.name + ".partial")  # renamed: a reader never sees it half written
    partial.write_text(json.dumps({"port": server.server_address[1]}))
    partial.rename(ready)
    server.serve_forever()


if __name__ == "__main__":
    main()
