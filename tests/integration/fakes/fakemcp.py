"""A minimal MCP streamable-HTTP client on the standard library, for the fake agent CLIs.

The fakes call tether's ``/mcp`` with the credential they were given, exactly as Claude
Code and Codex would: ``initialize`` (whose answer carries the ``mcp-session-id``), the
``notifications/initialized`` notice, then ``tools/call``. Answers may come as JSON or as
an SSE stream; both are read.
"""

import json
import urllib.error
import urllib.request

PROTOCOL = "2025-06-18"


class McpError(Exception):
    pass


def _post(url, headers, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    for name, value in headers.items():
        request.add_header(name, value)
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json, text/event-stream")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read().decode()
            return response.headers, response.headers.get("Content-Type", ""), raw
    except urllib.error.HTTPError as error:
        raise McpError(f"HTTP {error.code}: {error.read().decode(errors='replace')}") from None


def _message(content_type, raw):
    if "text/event-stream" in content_type:
        for line in raw.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data:
                    found = json.loads(data)
                    if "result" in found or "error" in found:
                        return found
        raise McpError("no JSON-RPC answer in the event stream")
    return json.loads(raw) if raw.strip() else {}


def call_tool(url, headers, name, arguments):
    """Call one tool; returns ``(is_error, text, structured)``."""
    got, kind, raw = _post(
        url,
        headers,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "fake-agent", "version": "0"},
            },
        },
    )
    answer = _message(kind, raw)
    if "error" in answer:
        raise McpError(f"initialize failed: {answer['error']}")
    session = dict(headers)
    if got.get("mcp-session-id"):
        session["mcp-session-id"] = got.get("mcp-session-id")
    session["mcp-protocol-version"] = answer.get("result", {}).get("protocolVersion", PROTOCOL)
    _post(url, session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    _, kind, raw = _post(
        url,
        session,
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
    )
    answer = _message(kind, raw)
    if "error" in answer:
        raise McpError(f"tools/call failed: {answer['error']}")
    result = answer.get("result", {})
    text = "".join(
        block.get("text", "") for block in result.get("content", []) if block.get("type") == "text"
    )
    return bool(result.get("isError")), text, result.get("structuredContent")
