"""A scripted Anthropic Messages API server: the only stand-in when the REAL Claude Code
CLI runs in the tests (``ANTHROPIC_BASE_URL`` points the CLI here).

It speaks the wire format byte for byte: ``POST /v1/messages`` answers a ``stream: true``
request with the SSE sequence ``message_start``, ``content_block_start`` /
``content_block_delta`` (``text_delta`` or ``input_json_delta``) / ``content_block_stop``
per block, ``message_delta`` (stop reason, usage) and ``message_stop``; a non-streamed
request gets the message as JSON; ``POST /v1/messages/count_tokens`` gets
``{"input_tokens": n}``. Every request is logged (``requests``, and one JSON line each in
``log_path`` when given) so a test can see what the CLI asked.

The "model" is deterministic and stateless: it decides from the conversation it is sent,
so a resumed session (after a kill) gets the answer the script says. The first user
message carries the script (or names a built-in one, see ``SCENARIOS``)::

    {"model_script": {
       "start":  [step, ...],          # the turn that answers the first message
       "end":    [[step, ...], ...],   # the n-th turn woken by a background task's end
       "event":  [[step, ...], ...],   # the n-th turn woken by a monitor event
       "message": [[step, ...], ...]}} # the n-th later user message

(the n-th list past the last: the last again). A task's end is a ``<task-notification>``
with a ``<status>``; a monitor event one without (Claude Code 2.1.3xx).

A step is one assistant message: ``{"text": T}`` (ends the turn) or ``{"tool": NAME,
"input": {...}}`` (a ``tool_use``; the CLI runs the tool and sends its result back, and the
next step answers that; ``{{background_id}}`` in an input is the latest background Bash's
id). A turn past its last step, or with no steps, says ``OK``. Requests
that are not the agent's main loop (no tools offered: titles, summaries, quota checks) get
a short text.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "claude-sonnet-4-5"
NOTIFICATION = "<task-notification>"

#: Named scripts, for tasks whose text cannot be a script (e.g. the probe's "run the suite").
SCENARIOS: dict[str, dict[str, Any]] = {
    "run the suite": {
        "start": [
            {"tool": "Bash", "input": {"command": "sleep 2.5; echo OK", "run_in_background": True}},
            {"text": "WAITING"},
        ],
        "end": [[{"text": "FINAL"}]],
    },
}


# ---------------------------------------------------------------------------- the model


def _text_of(content: Any) -> str:
    """The plain text of a message's content (a string or a list of blocks), tool results left out."""
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _is_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def script_of(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The script carried (or named) by the first user message that has one."""
    for message in messages:
        if message.get("role") != "user":
            continue
        text = _text_of(message.get("content", ""))
        found = re.search(r"\{\s*\"model_script\".*\}", text, re.DOTALL)
        if found:
            try:
                return dict(json.loads(found.group(0))["model_script"])
            except (ValueError, KeyError):
                return None
        for name, scenario in SCENARIOS.items():
            if name in text:
                return scenario
    return None


def _kind(text: str, first: bool) -> str:
    if NOTIFICATION in text:
        return "end" if "<status>" in text else "event"
    return "start" if first else "message"


def _opens(message: dict[str, Any]) -> bool:
    """A message that opens a turn: not the assistant's, not a tool result. (Claude Code
    sends a task's notice that arrives during a turn as a ``system`` message in
    ``messages``: the model answers it then and there.)"""
    return message.get("role") != "assistant" and not _is_tool_result(message)


def _turns(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Each turn-opening message as (kind, index in messages); such messages in a row
    (queued notices, reminders) open one turn, of the strongest kind."""
    rank = {"start": 3, "end": 2, "message": 1, "event": 0}
    opened: list[tuple[str, int]] = []
    for n, message in enumerate(messages):
        if not _opens(message):
            continue
        kind = _kind(_text_of(message.get("content", "")), not opened)
        if opened and _opens(messages[n - 1]):
            if rank[kind] > rank[opened[-1][0]]:
                opened[-1] = (kind, opened[-1][1])
            continue
        opened.append((kind, n))
    return opened


def next_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the script says comes next in this conversation."""
    script = script_of(messages) or {}
    turns = _turns(messages)
    if not turns:
        return {"text": "OK"}
    kind, opened_at = turns[-1]
    if kind == "start":
        steps = script.get("start", [])
    else:
        nth = sum(1 for k, _ in turns if k == kind) - 1
        options = script.get(kind, [])
        steps = options[min(nth, len(options) - 1)] if options else []
    done = sum(1 for m in messages[opened_at:] if m.get("role") == "assistant")
    return _fill(steps[done], messages) if done < len(steps) else {"text": "OK"}


_BACKGROUND_ID = re.compile(r"running in background with ID: (\w+)")


def _fill(step: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``{{background_id}}`` in a step: the id the CLI gave the latest background Bash (as
    its tool result says), so that a script can name it (e.g. to ``background_wait``)."""
    encoded = json.dumps(step)
    if "{{background_id}}" not in encoded:
        return step
    found = _BACKGROUND_ID.findall(json.dumps(messages))
    return dict(json.loads(encoded.replace("{{background_id}}", found[-1] if found else "")))


# ---------------------------------------------------------------------------- the wire


def _blocks(step: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    if "tool" in step:
        block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": step["tool"]}
        return [{**block, "input": step.get("input", {})}], "tool_use"
    return [{"type": "text", "text": str(step.get("text", "OK"))}], "end_turn"


def message_body(step: dict[str, Any], model: str, input_tokens: int) -> dict[str, Any]:
    content, stop = _blocks(step)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 5},
    }


def sse_events(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream of ``body`` as the Messages API sends it."""
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 1}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "ping", {"type": "ping"}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": body["usage"]["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


class ModelServer:
    """The server, on a loopback port in a thread of the test process."""

    def __init__(self, log_path: Path | None = None, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.log_path = log_path
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> ModelServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="model server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with open(self.log_path, "a") as log:
                    log.write(json.dumps(entry) + "\n")

    def main_loop(self) -> list[dict[str, Any]]:
        """Logged requests of the agent's loop (those offering tools), oldest first."""
        return [r for r in self.requests if r.get("tools")]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # the log is ``requests``
                pass

            def do_GET(self) -> None:
                server.record({"method": "GET", "path": self.path})
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})

            def do_HEAD(self) -> None:
                server.record({"method": "HEAD", "path": self.path})
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?", 1)[0]
                messages = body.get("messages") or []
                entry = {
                    "method": "POST",
                    "path": self.path,
                    "at": time.time(),
                    "model": body.get("model"),
                    "stream": bool(body.get("stream")),
                    "tools": [t.get("name") for t in body.get("tools") or []],
                    "apiKey": self.headers.get("x-api-key"),
                    "messages": messages,
                }
                if path.endswith("/count_tokens"):
                    server.record(entry)
                    self._json(200, {"input_tokens": max(1, len(raw) // 4)})
                    return
                if not path.endswith("/v1/messages"):
                    server.record(entry)
                    self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
                    return
                step = next_step(messages) if entry["tools"] else {"text": "OK"}
                entry["answer"] = step
                server.record(entry)
                reply = message_body(step, body.get("model") or MODEL, max(1, len(raw) // 4))
                if body.get("stream"):
                    self._stream(reply)
                else:
                    self._json(200, reply)

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, reply: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
                self.send_header("connection", "close")
                self.end_headers()
                for event, data in sse_events(reply):
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args()
    server = ModelServer(args.log, args.port)
    print(server.url, flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
