"""The command line (SPEC §7) against a running server: ``--json`` output parses, and says
what the API says; ``tether demo --json`` prints one JSON array of probe rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kit import wake_messages
from tether.launch import Server

from .helpers import await_threads, noting_parent, reply, rule, script, tasks_of, thread, wait_idle


def tether(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def tether_json(server: Server, *args: str) -> Any:
    done = tether(*args, "--json", "--url", server.url, "--token", server.token)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_thread_and_task_commands(shared_server: Server) -> None:
    child = script(
        rule("start", {"bash": "sleep 600", "background": True, "await": True, "id": "b1"}, reply("WAITING")),
        rule("background_command", reply("FINAL")),
    )
    parent = script(*noting_parent(child)["rules"], rule("user", reply("heard {{text}}"), repeat=True))

    created = tether_json(shared_server, "thread", "new", json.dumps(parent), "--title", "cli parent")
    assert set(created) >= {"threadId", "runId"}
    parent_id = created["threadId"]

    with shared_server.client() as client:
        wait_idle(client, parent_id)
        child_id = tasks_of(client, parent_id)[0]["childThreadId"]
        await_threads(
            shared_server,
            lambda: tasks_of(client, parent_id)[0]["workState"] == "waiting_background",
            {parent_id, child_id},
            what="the child waiting on its command",
        )

        listed = tether_json(shared_server, "task", "list", "--parent", parent_id)
        assert [t["taskId"] for t in listed["tasks"]] == [t["taskId"] for t in tasks_of(client, parent_id)]
        task_id = listed["tasks"][0]["taskId"]
        assert listed["tasks"][0]["status"] == "running"

        shown = tether_json(shared_server, "task", "show", task_id)
        assert shown["taskId"] == task_id and shown["childThreadId"] == child_id
        assert shown["workState"] == "waiting_background"

        cancelled = tether_json(shared_server, "task", "cancel", task_id, "--reason", "cli test")
        assert cancelled == {"taskId": task_id, "status": "cancelled"}
        assert client.get(f"/api/tasks/{task_id}").json()["status"] == "cancelled"

        waited = tether_json(shared_server, "thread", "wait", parent_id, "--settled", "--timeout-ms", "60000")
        assert waited["threadId"] == parent_id and waited["settled"] is True and waited["timedOut"] is False

        sent = tether_json(shared_server, "thread", "send", parent_id, "hello from the cli")
        assert set(sent) >= {"messageId", "runId", "delivery"}
        assert sent["delivery"] in ("started", "queued")

        waited = tether_json(shared_server, "thread", "wait", parent_id, "--settled", "--timeout-ms", "60000")
        assert waited["runId"] == sent["runId"]

        shown = tether_json(shared_server, "thread", "show", parent_id)
        assert shown == thread(client, parent_id)
        assert shown["runs"][-1]["reply"] == "heard hello from the cli"
        assert len(wake_messages(shown)) == 1 and ": cancelled]" in wake_messages(shown)[0]["text"]


def test_cli_errors_are_clear(shared_server: Server) -> None:
    done = tether(
        "thread", "show", "thr_nope", "--json", "--url", shared_server.url, "--token", shared_server.token
    )
    assert done.returncode != 0
    assert "404" in done.stderr and "thr_nope" in done.stderr
    done = tether("task", "list", "--json", "--url", shared_server.url, "--token", "wrong")
    assert done.returncode != 0 and "401" in done.stderr


def test_serve_refuses_an_unknown_process_backend(tmp_path: Path) -> None:
    done = tether("serve", "--data", str(tmp_path / "data"), env={"TETHER_PROCESSES": "kqueue"})
    assert done.returncode == 2
    assert "TETHER_PROCESSES='kqueue'" in done.stderr and "portable" in done.stderr
    assert not (tmp_path / "data").exists(), "nothing was started or written"


def test_serve_refuses_a_store_it_cannot_open(tmp_path: Path) -> None:
    done = tether("serve", "--data", str(tmp_path / "data"), "--store", "mysql://db/x")
    assert done.returncode == 2
    assert "'mysql'" in done.stderr and "postgresql://" in done.stderr
    assert not (tmp_path / "data").exists(), "nothing was started or written"


def test_demo_json() -> None:
    done = tether("demo", "--json", "--probes", "1,3", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)  # stdout is exactly one JSON array; logs go to stderr
    assert isinstance(rows, list) and rows
    for row in rows:
        assert set(row) >= {"probe", "where", "delivered", "deliveredAs", "wakes", "latencyMs"}, row
        assert row["delivered"] is True, row
        assert row["where"] in ("local", "remote")
    assert {row["probe"] for row in rows} == {1, 3}
    assert {(row["probe"], row["deliveredAs"]) for row in rows} == {(1, "follow-up"), (3, "result")}
    assert {row["where"] for row in rows} >= {"local"}
    assert all(row["wakes"] == (2 if row["probe"] == 1 else 1) for row in rows)
