"""A scripted OpenAI Responses API server for the real ``codex`` CLI.

``POST /v1/responses`` answers with the Responses API's server-sent events, byte for byte as
the service streams them (``event: <type>`` / ``data: <json>`` frames): ``response.created``,
``response.output_item.added``, ``response.output_text.delta`` (for a message),
``response.output_item.done`` and ``response.completed`` with usage. Everything received
is logged (``requests``, and one JSON line per request in ``log_path`` when given).

The "model" is deterministic and decides from the conversation it is sent. The task's
first user message carries a plan on a line of its own::

    MODEL-PLAN {"start": [steps], "monitor finished": [steps], "go on": [steps], ...}

A turn's rule is chosen by its latest user message: ``[tether: <what>]`` (tether's wake
prefix, e.g. ``monitor finished``, ``scheduled``, ``delegated task``) names rule
``<what>:<text>`` when the wake contains ``text``, else rule ``<what>``; a plain message
names the rule of its own text, else ``start``. Each response is one step of that
rule, the next one after the tool outputs the conversation already holds since that
message: ``{"tool": NAME, "arguments": {...}}`` (a tool of tether's MCP server, called
in the ``mcp__tether`` namespace), ``{"shell": CMD}`` (Codex's own ``exec_command``) or
``{"say": TEXT}`` (a message, which ends the turn — with a call in the same step, the
message is said on the way and the turn goes on); with ``"drop": N`` the first N
streams of that response break after ``response.created`` (Codex reconnects);
``{"fail": TEXT}`` streams ``response.failed`` with that message; ``"gate": PATH`` holds the
response until the file exists (a model still thinking). Codex defers MCP tools — it names the
namespace and shows its tools only through ``tool_search`` — so before the first tether
call of a conversation the model searches, as a real one must (``tool_search_call``).
A rule whose steps are used up says ``DONE``; a message without a plan gets ``ack``.
``<<output>>`` in a step is replaced by the text of the latest tool output, ``<<field>>``
by that field of the latest tool output (in the whole conversation) whose JSON has it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PLAN = "MODEL-PLAN "
NAMESPACE = "mcp__tether"
_CALL_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_WAKE = re.compile(r"^\[tether: ([^\]]+)\]")
_FIELD = re.compile(r"<<(\w+)>>")


# ----------------------------------------------------------------------------- the model


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _user_messages(conversation: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """``(position, text)`` of the user's own messages (not Codex's context blocks)."""
    found = []
    for n, item in enumerate(conversation):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            text = _text(item)
            if not text.lstrip().startswith("<"):
                found.append((n, text))
    return found


def _plan(messages: list[tuple[int, str]]) -> dict[str, list[dict[str, Any]]] | None:
    for _, text in messages:
        for line in text.splitlines():
            if line.startswith(PLAN):
                return dict(json.loads(line.removeprefix(PLAN)))
    return None


def _rule(plan: dict[str, list[dict[str, Any]]], latest: str) -> str:
    """``<wake>:<text>`` (the wake's text contains ``text``), else ``<wake>``, else the
    message itself, else ``start``."""
    wake = _WAKE.match(latest)
    if wake is None:
        return latest.strip() if latest.strip() in plan else "start"
    specific = [k for k in plan if k.startswith(f"{wake.group(1)}:") and k.partition(":")[2] in latest]
    return specific[0] if specific else wake.group(1)


def _json_of(output: str) -> dict[str, Any]:
    try:  # Codex prefixes a tool's output with "Wall time: ...\nOutput:"
        found = json.loads(output[output.index("{") :])
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _fill(value: Any, outputs: list[str]) -> Any:
    """``<<output>>`` (the latest tool output) and ``<<field>>`` (that field of the latest
    tool output that has it, in the whole conversation) inside the strings of ``value``."""
    if isinstance(value, dict):
        return {k: _fill(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, outputs) for v in value]
    if not isinstance(value, str):
        return value

    def field(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "output":
            return outputs[-1] if outputs else ""
        found = [fields[name] for fields in map(_json_of, reversed(outputs)) if name in fields]
        return str(found[0]) if found else ""

    return _FIELD.sub(field, value)


def _namespace_loaded(conversation: list[dict[str, Any]]) -> bool:
    """Codex defers MCP tools: they are callable once a ``tool_search`` has shown them."""
    return any(
        tool.get("name") == NAMESPACE
        for item in conversation
        if item.get("type") == "tool_search_output"
        for tool in item.get("tools") or []
    )


def _output_text(item: dict[str, Any]) -> str:
    output = item.get("output", "")
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    return str(output)


def decide(conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The next step for this conversation (what the model "writes")."""
    messages = _user_messages(conversation)
    plan = _plan(messages)
    if plan is None or not messages:
        return {"say": "ack"}
    position, latest = messages[-1]
    done = [i for i in conversation[position + 1 :] if i.get("type") in _CALL_OUTPUTS]
    steps = plan.get(_rule(plan, latest), [{"say": "DONE"}])
    step = steps[len(done)] if len(done) < len(steps) else {"say": "DONE"}
    if "tool" in step and not _namespace_loaded(conversation):
        return {"search": f"tether {step['tool']}"}
    outputs = [_output_text(i) for i in conversation if i.get("type") in _CALL_OUTPUTS]
    return dict(_fill(step, outputs))


# ----------------------------------------------------------------------------- the wire


def _frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _message(text: str, n: int) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{n}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call(step: dict[str, Any], n: int) -> dict[str, Any]:
    """The call item of a ``search``, ``shell`` or ``tool`` step."""
    if "search" in step:
        return {
            "type": "tool_search_call",
            "id": f"ts_{n}",
            "call_id": f"call_{n}",
            "status": "completed",
            "execution": "client",
            "arguments": {"query": step["search"]},
        }
    if "shell" in step:
        name, namespace, arguments = "exec_command", None, {"cmd": step["shell"]}
    else:
        name, namespace, arguments = step["tool"], NAMESPACE, step.get("arguments", {})
    item = {
        "type": "function_call",
        "id": f"fc_{n}",
        "status": "completed",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": json.dumps(arguments),
    }
    if namespace:
        item["namespace"] = namespace
    return item


def output_items(step: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The output of one step, as ``response.output_item.done`` carries each item: a message
    (``say``), a call, or both — a message said on the way, before a call."""
    items = [_message(step["say"], n)] if "say" in step else []
    if {"search", "shell", "tool"} & set(step):
        items.append(_call(step, n))
    return items


def _item_frames(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    if item["type"] != "message":
        added = [{"type": "response.output_item.added", "output_index": index, "item": item}]
    else:
        text = item["content"][0]["text"]
        added = [
            {"type": "response.output_item.added", "output_index": index,
             "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
             "content_index": 0, "delta": text},
        ]
    return [*added, {"type": "response.output_item.done", "output_index": index, "item": item}]


def stream(step: dict[str, Any], n: int, usage: dict[str, int]) -> list[bytes]:
    """The SSE frames of one response whose output is ``step``."""
    response_id = f"resp_{n}"
    frames = [{"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}]
    if "fail" in step:
        error = {"code": step.get("code", "server_error"), "message": step["fail"]}
        failed = {"id": response_id, "status": "failed", "error": error, "output": []}
        return [_frame(f) for f in (*frames, {"type": "response.failed", "response": failed})]
    items = output_items(step, n)
    for index, item in enumerate(items):
        frames += _item_frames(item, index)
    frames.append({
        "type": "response.completed",
        "response": {
            "id": response_id,
            "status": "completed",
            "output": items,
            "usage": {
                "input_tokens": usage["input"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage["output"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["input"] + usage["output"],
            },
        },
    })
    return [_frame(f) for f in frames]


class ResponsesServer:
    """The server on a free loopback port, in a thread of the test process."""

    def __init__(self, log_path: Path | None = None, api_key: str | None = None) -> None:
        self.log_path = log_path
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._attempts: dict[str, int] = {}
        self._arrived = threading.Condition(self._lock)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def start(self) -> ResponsesServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def responses(self) -> list[dict[str, Any]]:
        """The bodies of every ``POST /v1/responses`` received so far."""
        with self._lock:  # reentrant: await_request calls this holding it
            return [r["body"] for r in self.requests if r["path"] == "/v1/responses"]

    def await_request(self, match: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
        """The first ``POST /v1/responses`` body that ``match``es, waiting for it if need be."""
        with self._arrived:
            found = self._arrived.wait_for(lambda: next(filter(match, self.responses()), None), timeout)
        assert found is not None, f"no matching request within {timeout}s"
        return found

    @staticmethod
    def hold(gate: Path, timeout: float = 120.0) -> None:
        """Answer only once ``gate`` exists (the request's own thread waits, not the server)."""
        deadline = time.monotonic() + timeout
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a file has no event to await; this is the "model" being slow

    def _drop(self, body: dict[str, Any], step: dict[str, Any]) -> bool:
        """Whether to break this response's stream: the first ``step["drop"]`` attempts of it."""
        key = f"{body.get('prompt_cache_key')}:{len(body.get('input') or [])}"
        with self._lock:
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key] <= int(step.get("drop", 0))

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with self.log_path.open("a") as log:
                    log.write(json.dumps(entry) + "\n")
            self._arrived.notify_all()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: requests are logged
                pass

            def _entry(self, body: Any) -> dict[str, Any]:
                return {"method": self.command, "path": self.path.split("?")[0],
                        "headers": dict(self.headers), "body": body}

            def do_GET(self) -> None:
                server._record(self._entry(None))
                self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                server._record(self._entry(body))
                if self.path.split("?")[0] != "/v1/responses":
                    self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})
                    return
                if server.api_key and self.headers.get("authorization") != f"Bearer {server.api_key}":
                    self._json(401, {"error": {"message": "bad API key", "type": "invalid_request_error"}})
                    return
                conversation = body.get("input") or []
                step = decide(conversation)
                usage = {"input": 100 + 10 * len(conversation), "output": 7}
                frames = stream(step, next(server._ids), usage)
                if "gate" in step:  # a slow model: it answers once the test creates the file
                    server.hold(Path(step["gate"]))
                if server._drop(body, step):  # the stream breaks after its first event
                    frames = frames[:1]
                    self.close_connection = True
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(sum(len(f) for f in frames)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # Codex is gone
                    for frame in frames:
                        self.wfile.write(frame)
                        self.wfile.flush()

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
