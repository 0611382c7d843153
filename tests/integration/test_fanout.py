"""Fan-out: one parent, five children whose background commands end at the same moment.

Every command blocks on a lock the test holds; letting go ends all of them at once. Each
result must reach the parent exactly once (G1, G3); wakes may fold (results that complete
while a wake is queued join it), so FINALs are counted per task id across all wakes.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

from kit import reported, wake_messages, wake_runs
from tether.launch import Server

from .helpers import (
    await_threads,
    new_thread,
    noting_parent,
    reply,
    rule,
    script,
    settled_tree,
    tasks_of,
    thread,
)

CHILDREN = 5
PARENTS = 3  # the scenario, three times over at once


def gated_child(lock: Path) -> dict[str, Any]:
    return script(
        rule(
            "start",
            {"bash": f"flock -s {lock} true; echo OK", "background": True, "await": True, "id": "b1"},
            reply("WAITING"),
        ),
        rule("background_command", reply("FINAL")),
    )


def test_five_children_finishing_together(shared_server: Server, tmp_path: Path) -> None:
    lock = tmp_path / "gate.lock"
    with open(lock, "w") as gate, shared_server.client() as client:
        fcntl.flock(gate, fcntl.LOCK_EX)
        parents = [
            new_thread(client, noting_parent(*[gated_child(lock)] * CHILDREN), title=f"fan-out {n}")
            for n in range(PARENTS)
        ]
        watched: set[str] = set(parents)

        def all_waiting() -> bool:
            tasks = [t for p in parents for t in tasks_of(client, p)]
            watched.update(t["childThreadId"] for t in tasks)
            return len(tasks) == PARENTS * CHILDREN and all(
                t["workState"] == "waiting_background" and t["status"] == "running" for t in tasks
            )

        await_threads(shared_server, all_waiting, watched, what="every child waiting on its command")
        fcntl.flock(gate, fcntl.LOCK_UN)  # all commands end now

        for parent_id in parents:
            settled_tree(client, parent_id)
        records = [(thread(client, p), tasks_of(client, p)) for p in parents]

    for parent, tasks in records:
        assert len(tasks) == CHILDREN, "no follow-ups: each FINAL was its task's result"
        assert all(not t["followUpOf"] for t in tasks)
        assert [t["result"]["text"] for t in tasks] == ["FINAL"] * CHILDREN
        ids = {t["taskId"] for t in tasks}
        # Each task reported exactly once, with FINAL exactly once, across all wakes.
        assert reported(parent) == dict.fromkeys(ids, 1), [m["text"] for m in wake_messages(parent)]
        texts = [m["text"] for m in wake_messages(parent)]
        assert sum(text.count("FINAL") for text in texts) == CHILDREN
        assert not any("WAITING" in text for text in texts)
        listed = [task_id for m in wake_messages(parent) for task_id in m["source"]["taskIds"]]
        assert sorted(listed) == sorted(ids)
        # One wake run per wake message, at most one per result.
        assert len(wake_runs(parent)) == len(wake_messages(parent)) <= CHILDREN
        for task in tasks:
            assert task["delivery"]["state"] == "acknowledged"
            wake = next(m for m in wake_messages(parent) if task["taskId"] in m["source"]["taskIds"])
            assert task["delivery"]["wakeMessageId"] == wake["messageId"]
            assert task["delivery"]["wakeRunId"] == wake["runId"]
