"""Shared helpers of the integration tests: scripts, waits driven by events, and readers.

Nothing here sleeps to synchronise: every wait is a server-side wait (``/wait``), the event
feed (``follow_events``) or a pidfd. Timeouts are only upper bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tether.launch import Server, follow_events

#: Upper bound for one scenario to finish; a correct server needs a fraction of it.
TIMEOUT = 60.0


# ---------------------------------------------------------------------------- scripts


def script(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"tether_script": 1, "rules": list(rules)}


def rule(on: str, *actions: dict[str, Any], repeat: bool = False) -> dict[str, Any]:
    found: dict[str, Any] = {"on": on, "do": list(actions)}
    if repeat:
        found["repeat"] = True
    return found


def reply(text: str) -> dict[str, Any]:
    return {"reply": text}


def delegate(task: dict[str, Any] | str, ref: str = "c", **extra: Any) -> dict[str, Any]:
    return {"delegate": {"task": task, "id": ref, **extra}}


def noting_parent(*children: dict[str, Any], title: str | None = None) -> dict[str, Any]:
    """A parent that delegates ``children`` (ids c1, c2 ... or c for one) async and replies
    ``got <wake text>`` to every completion wake."""
    refs = ["c"] if len(children) == 1 else [f"c{n}" for n in range(1, len(children) + 1)]
    actions = [
        delegate(child, ref, **({"title": title} if title else {}))
        for ref, child in zip(refs, children, strict=True)
    ]
    return script(
        rule("start", *actions, reply("delegated")),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )


# ---------------------------------------------------------------------------- API


def new_thread(client: httpx.Client, body: dict[str, Any] | str, title: str | None = None) -> str:
    message = body if isinstance(body, str) else json.dumps(body)
    created = client.post("/api/threads", json={"provider": "script", "title": title, "message": message})
    assert created.status_code == 201, created.text
    return created.json()["threadId"]


def thread(client: httpx.Client, thread_id: str) -> dict[str, Any]:
    found = client.get(f"/api/threads/{thread_id}")
    assert found.status_code == 200, found.text
    return found.json()


def tasks_of(client: httpx.Client, parent_id: str) -> list[dict[str, Any]]:
    found = client.get("/api/tasks", params={"parentThreadId": parent_id})
    assert found.status_code == 200, found.text
    return found.json()["tasks"]


def wait_settled(client: httpx.Client, thread_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Block (server side) until the thread is settled; fail if it is not within ``timeout``."""
    answer = client.get(
        f"/api/threads/{thread_id}/wait",
        params={"untilSettled": "true", "timeoutMs": int(timeout * 1000)},
        timeout=timeout + 30,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert not body["timedOut"] and body["settled"], f"{thread_id} did not settle within {timeout}s: {body}"
    return body


def wait_idle(client: httpx.Client, thread_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    answer = client.get(
        f"/api/threads/{thread_id}/wait", params={"timeoutMs": int(timeout * 1000)}, timeout=timeout + 30
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert not body["timedOut"], f"{thread_id} did not become idle within {timeout}s: {body}"
    return body


def await_state(server: Server, check: Callable[[], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
    """Re-run ``check`` after every event of the server's feed until it is truthy."""
    result = follow_events(server.url, server.token, check, timeout)
    assert result, f"timed out after {timeout}s waiting for {what or check}"
    return result


def await_threads(
    server: Server, check: Callable[[], Any], threads: set[str], timeout: float = TIMEOUT, what: str = ""
) -> Any:
    """Like :func:`await_state`, but re-run ``check`` only after events of ``threads``
    (a set ``check`` may grow, e.g. with a child's id once it is known): cheap enough for
    many concurrent waits on one server."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.stream(
        "GET",
        f"{server.url}/api/events",
        params={"after": "now", "keepalive": "1"},
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=5.0),
    ) as response:
        assert response.status_code == 200, response.read()
        result = check()
        if result:
            return result
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                break
            if line.startswith("data:"):
                if json.loads(line.removeprefix("data:").strip()).get("threadId") not in threads:
                    continue
            elif not line.startswith(":"):
                continue
            result = check()
            if result:
                return result
    result = check()
    assert result, f"timed out after {timeout}s waiting for {what or check}"
    return result


def settled_tree(client: httpx.Client, parent_id: str, timeout: float = TIMEOUT) -> None:
    """The parent and every child of it settled (nothing left that could wake anyone)."""
    wait_settled(client, parent_id, timeout)
    for child in {t["childThreadId"] for t in tasks_of(client, parent_id)}:
        wait_settled(client, child, timeout)
    wait_settled(client, parent_id, timeout)


# ---------------------------------------------------------------------------- reading


# ---------------------------------------------------------------------------- SSE


def sse_events(
    url: str,
    token: str,
    after: str,
    until: Callable[[dict[str, Any]], bool],
    timeout: float = 30.0,
    on_open: Callable[[], Any] | None = None,
    keepalive: float | None = None,
) -> list[dict[str, Any]]:
    """Read ``/api/events`` from ``after`` until an event matches ``until``; return them all.
    ``on_open`` runs once the feed is open (its cursor fixed), before reading; ``keepalive``
    is the server's keepalive interval (its default when None)."""
    found: list[dict[str, Any]] = []
    params = {"after": after} if keepalive is None else {"after": after, "keepalive": str(keepalive)}
    with httpx.stream(
        "GET",
        f"{url}/api/events",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(timeout, connect=5.0),
    ) as response:
        assert response.status_code == 200, response.read()
        if on_open is not None:
            on_open()
        for line in response.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line.removeprefix("data:").strip())
                found.append(event)
                if until(event):
                    return found
    raise AssertionError(f"the feed ended before the awaited event; read {len(found)}")


# ---------------------------------------------------------------------------- processes


def probe_1_with(env: Server, client: httpx.Client, provider: str) -> dict[str, Any]:
    """SPEC §8 probe 1 with a child on ``provider``: a script parent delegates "run the
    suite"; returns ``{tasks, parent, child, row}`` once FINAL is delivered and every thread
    is quiet (checked twice: a late duplicate would show in the second look)."""
    from tether.probes import finished, outcome  # probes is the shared definition

    parent_id = client.post(
        "/api/threads",
        json={
            "provider": "script",
            "title": f"probe 1 ({provider})",
            "message": json.dumps(
                script(
                    rule(
                        "start",
                        delegate("run the suite", provider=provider, title="probe 1"),
                        reply("delegated"),
                    ),
                    rule("delegated_task", reply("got {{text}}"), repeat=True),
                )
            ),
        },
    ).json()["threadId"]
    watched = {parent_id}

    def check() -> dict[str, Any] | None:
        tasks = tasks_of(client, parent_id)
        watched.update(t["childThreadId"] for t in tasks if t["childThreadId"])
        parent = thread(client, parent_id)
        if not finished(tasks, parent):
            return None
        child = thread(client, tasks[0]["childThreadId"])
        if not child["settled"] or any(i["status"] == "running" for i in child["background"]):
            return None
        return {"tasks": tasks, "parent": parent, "child": child}

    await_threads(env, check, watched, what=f"FINAL from the {provider} child")
    settled_tree(client, parent_id)
    record = check()
    assert record is not None
    record["row"] = outcome(1, "local", record["tasks"], record["parent"], record["child"]["runs"])
    return record


def providers(data: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``tether providers --data DATA --json`` as a user runs it, by provider name."""
    done = subprocess.run(
        [sys.executable, "-m", "tether", "providers", "--data", str(data), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return {row["provider"]: row for row in json.loads(done.stdout)}
