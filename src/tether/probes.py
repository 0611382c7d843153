"""The probe matrix of SPEC §8: the original failure, as scripts.

Each probe is a child script delegated ``async`` by a parent script; each must deliver
``FINAL`` to the parent exactly once, with the child local or remote. The demo runs them,
and so do the integration tests.
"""

from __future__ import annotations

import sys
from typing import Any

from tether.ids import millis_between

_FINAL = [{"reply": "FINAL"}]


def shell_commands(seconds: float, platform: str = sys.platform) -> tuple[str, str]:
    """The probes' two commands, ``(sleep then OK, three lines)``, in the platform's
    shell: SPEC §8's ``sleep N; echo OK`` on POSIX; on Windows, where cmd.exe has no
    ``sleep``, the same through this Python (double quotes for cmd, single inside)."""
    if platform != "win32":
        return f"sleep {seconds}; echo OK", f"for i in 1 2 3; do sleep {seconds / 3:.2f}; echo line$i; done"
    python = f'"{sys.executable}" -u -c'
    return (
        f"{python} \"import time; time.sleep({seconds}); print('OK')\"",
        f"{python} \"import time; [(time.sleep({seconds / 3:.2f}), print('line' + str(i)))"
        f' for i in (1, 2, 3)]"',
    )


def child_script(probe: int, seconds: float = 1.0, platform: str = sys.platform) -> dict[str, Any]:
    """The child of probe 1-6. ``seconds`` is how long its background work takes."""
    sleep_ok, lines = shell_commands(seconds, platform)
    rules: dict[int, list[dict[str, Any]]] = {
        1: [
            {
                "on": "start",
                "do": [
                    {"bash": sleep_ok, "background": True, "id": "b1"},
                    {"reply": "WAITING"},
                ],
            },
            {"on": "background_command", "do": _FINAL},
        ],
        2: [
            {"on": "start", "do": [{"monitor": lines, "id": "m1"}, {"reply": "WAITING"}]},
            {"on": "monitor_event", "repeat": True, "do": [{"reply": "PROGRESS"}]},
            {"on": "monitor_finished", "do": _FINAL},
        ],
        3: [
            {
                "on": "start",
                "do": [
                    {"bash": sleep_ok, "background": True, "id": "b1", "await": True},
                    {"reply": "WAITING"},
                ],
            },
            {"on": "background_command", "do": _FINAL},
        ],
        4: [
            {
                "on": "start",
                "do": [
                    {"schedule": {"in_ms": int(seconds * 1000), "text": "time is up", "hold": True}},
                    {"reply": "WAITING"},
                ],
            },
            {"on": "scheduled", "do": _FINAL},
        ],
        5: [
            {"on": "start", "do": [{"reply": "READY"}]},
            {"on": "message", "do": _FINAL},
        ],
        6: [
            {
                "on": "start",
                "do": [{"monitor": lines, "persistent": True, "id": "m1"}, {"reply": "WATCHING"}],
            },
            {"on": "monitor_event", "repeat": True, "do": [{"reply": "PROGRESS"}]},
            {"on": "monitor_finished", "do": _FINAL},
        ],
    }
    return {"tether_script": 1, "rules": rules[probe]}


def parent_script(probe: int, environment: str | None = None, seconds: float = 1.0) -> dict[str, Any]:
    """A parent that delegates probe ``probe``'s child and notes every wake it gets."""
    delegate: dict[str, Any] = {"task": child_script(probe, seconds), "id": "c", "title": f"probe {probe}"}
    if environment:
        delegate["environment"] = environment
    rules: list[dict[str, Any]] = [{"on": "start", "do": [{"delegate": delegate}, {"reply": "delegated"}]}]
    if probe == 5:
        rules.append(
            {
                "on": "delegated_task",
                "do": [{"thread_send": {"thread": "child:c", "text": "go on"}}, {"reply": "sent"}],
            }
        )
    rules.append({"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]})
    return {"tether_script": 1, "rules": rules}


def finished(tasks: list[dict[str, Any]], parent: dict[str, Any]) -> bool:
    """The probe is over: FINAL is a result, every task delivered, the parent settled."""
    if not tasks or not parent["settled"]:
        return False
    if not any((t.get("result") or {}).get("text") == "FINAL" for t in tasks):
        return False
    return all(t["status"] not in ("queued", "running") for t in tasks) and all(
        t["delivery"]["state"] in ("acknowledged", "disposed") for t in tasks
    )


def outcome(
    probe: int,
    where: str,
    tasks: list[dict[str, Any]],
    parent: dict[str, Any],
    child_runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the parent received: one row of the demo's table."""
    wakes = [r for r in parent["runs"] if r["trigger"]["kind"] == "delegated_task"]
    wake_texts = [
        m["text"]
        for m in parent["messages"]
        if m["role"] == "notification" and (m["source"] or {}).get("kind") == "delegated_task"
    ]
    finals = sum(text.count("FINAL") for text in wake_texts)
    root = next((t for t in tasks if not t["followUpOf"]), None)
    carrier = next((t for t in tasks if (t.get("result") or {}).get("text") == "FINAL"), None)
    latency = None
    if carrier is not None:
        answer = next((r for r in child_runs if r["runId"] == carrier["result"]["runId"]), None)
        wake = next((r for r in wakes if r["runId"] == carrier["delivery"].get("wakeRunId")), None)
        if answer and wake and answer["endedAt"] and wake["startedAt"]:
            latency = round(millis_between(answer["endedAt"], wake["startedAt"]), 1)
    return {
        "probe": probe,
        "where": where,
        "delivered": finals == 1,
        "deliveredAs": None if carrier is None else ("follow-up" if carrier["followUpOf"] else "result"),
        "result": ((root or {}).get("result") or {}).get("text"),
        "followUps": [(t.get("result") or {}).get("text") for t in tasks if t["followUpOf"]],
        "wakes": len(wakes),
        "finalCount": finals,
        "latencyMs": latency,
    }
