"""``delegate`` with ``mode: "wait"`` (G8, and the exception of G3).

A wait-mode call that times out returns, the calling run goes on, the task goes on, and
its result arrives later as exactly one completion wake. A wait-mode call that gets its
result hands it back to the caller and wakes nobody.
"""

from __future__ import annotations

from kit import runs_of, wake_messages, wake_runs
from tether.launch import Server

from .helpers import delegate, new_thread, reply, rule, script, settled_tree, tasks_of, thread


def slow_child(seconds: float) -> dict:
    """Replies WAITING, then FINAL when its awaited ``sleep`` ends ``seconds`` later."""
    return script(
        rule(
            "start",
            {"bash": f"sleep {seconds}; echo OK", "background": True, "await": True, "id": "b1"},
            reply("WAITING"),
        ),
        rule("background_command", reply("FINAL")),
    )


def test_wait_mode_timeout_then_one_wake(shared_server: Server) -> None:
    parent_script = script(
        rule(
            "start",
            delegate(slow_child(1.5), mode="wait", timeout_ms=300, title="slow"),
            reply("after wait: {{tasks.c.status}}"),
        ),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )
    with shared_server.client() as client:
        parent_id = new_thread(client, parent_script)
        settled_tree(client, parent_id)
        parent = thread(client, parent_id)
        tasks = tasks_of(client, parent_id)

    first = parent["runs"][0]
    assert first["trigger"]["kind"] == "user"
    assert first["status"] == "completed", "the calling run goes on after the timeout"
    assert first["reply"] in ("after wait: running", "after wait: queued"), first["reply"]
    task = tasks[0]
    assert task["mode"] == "wait"
    assert [t["result"]["text"] for t in tasks] == ["FINAL"], "the task went on; no re-dispatch"
    assert first["endedAt"] < task["completedAt"], "the call returned before the task ended"

    wakes = wake_messages(parent)
    assert len(wakes) == 1 and len(wake_runs(parent)) == 1
    assert wakes[0]["text"].count("FINAL") == 1 and "WAITING" not in wakes[0]["text"]
    assert task["delivery"]["state"] == "acknowledged"
    assert task["delivery"]["deliveredAs"] == "result"
    assert task["delivery"]["wakeRunId"] == wake_runs(parent)[0]["runId"]
    assert wake_runs(parent)[0]["reply"].startswith("got ")


def test_wait_mode_result_handed_back_without_wake(shared_server: Server) -> None:
    parent_script = script(
        rule(
            "start",
            delegate(slow_child(0.3), mode="wait", timeout_ms=30_000),
            reply("result={{tasks.c.result}} status={{tasks.c.status}}"),
        ),
        rule("delegated_task", reply("WOKEN"), repeat=True),
    )
    with shared_server.client() as client:
        parent_id = new_thread(client, parent_script)
        settled_tree(client, parent_id)
        parent = thread(client, parent_id)
        tasks = tasks_of(client, parent_id)

    assert parent["runs"][0]["reply"] == "result=FINAL status=completed"
    assert wake_messages(parent) == [] and wake_runs(parent) == [], "the call delivered it: no wake (G3)"
    assert [r["trigger"]["kind"] for r in parent["runs"]] == ["user"]
    task = tasks[0]
    assert [t["result"]["text"] for t in tasks] == ["FINAL"]
    assert task["delivery"]["deliveredAs"] == "call"
    assert task["delivery"]["state"] == "acknowledged"
    assert task["delivery"]["wakeMessageId"] is None


def test_wait_mode_many_at_once(shared_server: Server) -> None:
    """Several wait-mode calls from one run, some timing out and some not: each result is
    delivered once, either by its call or by a wake, never both."""
    parent_script = script(
        rule(
            "start",
            delegate(slow_child(0.2), "quick", mode="wait", timeout_ms=30_000),
            delegate(slow_child(1.0), "slow", mode="wait", timeout_ms=100),
            delegate(script(rule("start", reply("FINAL"))), "instant", mode="wait", timeout_ms=30_000),
            reply("quick={{tasks.quick.result}} slow={{tasks.slow.status}} instant={{tasks.instant.result}}"),
        ),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )
    with shared_server.client() as client:
        parent_id = new_thread(client, parent_script)
        settled_tree(client, parent_id)
        parent = thread(client, parent_id)
        tasks = tasks_of(client, parent_id)

    assert parent["runs"][0]["reply"] in (
        "quick=FINAL slow=running instant=FINAL",
        "quick=FINAL slow=queued instant=FINAL",
    )
    assert all(t["result"]["text"] == "FINAL" for t in tasks) and len(tasks) == 3
    by_how = sorted(t["delivery"]["deliveredAs"] for t in tasks)
    assert by_how == ["call", "call", "result"]
    wakes = wake_messages(parent)
    assert len(wakes) == 1 and wakes[0]["text"].count("FINAL") == 1
    slow = next(t for t in tasks if t["delivery"]["deliveredAs"] == "result")
    assert wakes[0]["source"]["taskIds"] == [slow["taskId"]]
    assert len(runs_of(parent, "delegated_task")) == 1
