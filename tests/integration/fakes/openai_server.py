"""A fake OpenAI-compatible chat-completions server on loopback, scripted by the test.

It answers ``POST /v1/chat/completions`` with ``stream: true`` the way the real API
streams: ``data: {chunk}`` lines whose ``choices[0].delta`` carries ``content`` pieces or
``tool_calls`` fragments (``index``, ``id``, ``type``, ``function.name``, and the
``function.arguments`` text cut into several pieces), a last chunk with
``finish_reason`` (``stop`` or ``tool_calls``), then ``data: [DONE]``.

The test's ``script`` sees the request's messages and returns what the model says next:
:class:`Text` (a final answer) or a list of :class:`Call` (tool calls, with an optional
:class:`Text` said along with them). Every request is
kept in ``requests`` for assertions; a script that raises answers 500 and is kept in
``errors``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from typing import Any


@dataclass
class Text:
    text: str


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


#: A final text, or tool calls (a :class:`Text` among them is said before the calls).
Reply = Text | list[Call | Text]
Script = Callable[[list[dict[str, Any]]], Reply]

#: Pieces the text and the tool-call arguments are cut into (so the client must assemble them).
TEXT_PIECE = 3
ARGUMENT_PIECE = 7


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class FakeOpenAI:
    def __init__(self, script: Script, api_key: str = "fake-key", model: str = "fake-model") -> None:
        self.script = script
        self.api_key = api_key
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._ids = count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The ``base_url`` a client uses."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ answers

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of the streamed answer to one request."""
        with self._lock:
            self.requests.append(body)
            reply = self.script(body["messages"])
            n = next(self._ids)
        base = {"id": f"chatcmpl-fake{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model", self.model), "system_fingerprint": "fp_fake"}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        if isinstance(reply, Text):
            chunks += [chunk({"content": piece}) for piece in pieces(reply.text, TEXT_PIECE)]
            chunks.append(chunk({}, "stop"))
        else:
            for said in (item for item in reply if isinstance(item, Text)):
                chunks += [chunk({"content": piece}) for piece in pieces(said.text, TEXT_PIECE)]
            calls = [item for item in reply if isinstance(item, Call)]
            for index, call in enumerate(calls):
                head = {"index": index, "id": f"call_{n}_{index}", "type": "function",
                        "function": {"name": call.name, "arguments": ""}}
                chunks.append(chunk({"tool_calls": [head]}))
                for piece in pieces(json.dumps(call.arguments), ARGUMENT_PIECE):
                    chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
            chunks.append(chunk({}, "tool_calls"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            chunks.append({**base, "choices": [], "usage": usage})
        return chunks

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _fail(self, status: int, message: str, kind: str) -> None:
                self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._fail(404, f"no route {self.path}", "invalid_request_error")
                    return
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._fail(401, "Incorrect API key provided", "invalid_request_error")
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if body.get("stream") is not True:
                    self._fail(400, "this fake only streams: send stream true", "invalid_request_error")
                    return
                try:
                    chunks = fake.answer(body)
                except Exception as error:  # the test's script failed: make it visible
                    fake.errors.append(repr(error))
                    self._fail(500, repr(error), "server_error")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler


# ---------------------------------------------------------------------------- reading requests


def last(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return messages[-1]


def first_user(messages: list[dict[str, Any]]) -> str:
    return next((m.get("content") or "" for m in messages if m["role"] == "user"), "")


def tool_result(messages: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The parsed content of the last message if it is the result of a call of tool ``name``."""
    message = messages[-1]
    if message["role"] != "tool":
        return None
    calls = {c["id"]: c["function"]["name"] for m in messages if m["role"] == "assistant"
             for c in m.get("tool_calls") or []}
    if calls.get(message["tool_call_id"]) != name:
        return None
    return json.loads(message["content"])
