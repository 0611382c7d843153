"""The API calls tests make of one server, with its admin token unless told otherwise."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tether.launch import Server


def env_id(server: Server) -> str:
    return str(httpx.get(f"{server.url}/api/health", timeout=10).json()["environmentId"])


def new_thread(
    server: Server, script: dict[str, Any], title: str = "parent", token: str | None = None
) -> str:
    """A ``script`` thread running ``script``; its id."""
    headers = {"Authorization": f"Bearer {token or server.token}"}
    body = {"provider": "script", "title": title, "message": json.dumps(script)}
    response = httpx.post(f"{server.url}/api/threads", headers=headers, timeout=60, json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["threadId"])


def thread(server: Server, thread_id: str) -> dict[str, Any]:
    with server.client() as client:
        response = client.get(f"/api/threads/{thread_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def tasks_of(server: Server, parent_thread_id: str) -> list[dict[str, Any]]:
    with server.client() as client:
        response = client.get("/api/tasks", params={"parentThreadId": parent_thread_id})
    assert response.status_code == 200, response.text
    return list(response.json()["tasks"])


def wait_settled(server: Server, thread_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """Block (server side, ``/wait``) until the thread is settled; its answer."""
    with server.client(timeout=timeout + 10) as client:
        params = {"untilSettled": "true", "timeoutMs": int(timeout * 1000)}
        response = client.get(f"/api/threads/{thread_id}/wait", params=params)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["settled"] and not answer["timedOut"], f"{thread_id} not settled in {timeout}s: {answer}"
    return dict(answer)
