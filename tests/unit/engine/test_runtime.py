"""The runtime's outbox: a side effect that fails is retried, then parked and shown —
never dropped — and what waited on it fails visibly. Its loops are supervised."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import ItemStatus, RunStatus
from tether.engine import runtime as runtime_module
from tether.engine.port import Services
from tether.engine.queries import Queries
from tether.engine.runtime import PARK_AFTER, Runtime, retry_at
from tether.providers.script import ScriptProvider
from tether.store.base import OutboxRow
from tether.store.sqlite import SQLiteStore
from tether.tools.surface import Tools
from tether.types import ADMIN, Caller


@pytest.fixture
async def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:
    monkeypatch.setattr(runtime_module, "RETRY_FIRST", 0.001)  # retries in ms, not seconds
    store = SQLiteStore(tmp_path / "tether.db")
    rt = Runtime(store, "env_test", tmp_path, {"script": ScriptProvider()})
    tools = Tools(rt.commands, Queries(rt.commands), rt.notifier, "test")
    await rt.start(Services(rt.commands, tools, rt.workspace, rt.processes.backend, rt.commands.view))
    yield rt
    await rt.close()
    store.close()


async def until(rt: Runtime, keys: list[str], check: Callable[[], Any]) -> Any:
    found = await rt.notifier.wait_until(keys, check, timeout=10)
    assert found is not None, "timed out"
    return found


def thread_of(rt: Runtime) -> Caller:
    created = rt.commands.create_thread(ADMIN, "script", "t")
    return Caller("thread", thread_id=created["threadId"])


def test_retry_times_double_up_to_the_cap_then_park() -> None:
    assert retry_at(1, 100.0) == pytest.approx(100.0 + runtime_module.RETRY_FIRST)
    assert retry_at(2, 100.0) == pytest.approx(100.0 + 2 * runtime_module.RETRY_FIRST)
    assert retry_at(PARK_AFTER - 1, 0.0) <= runtime_module.RETRY_MAX
    assert retry_at(PARK_AFTER, 0.0) is None


async def test_a_side_effect_that_fails_a_few_times_is_retried_until_it_works(runtime: Runtime) -> None:
    attempts: list[int] = []

    def flaky(row: OutboxRow) -> None:
        attempts.append(row.attempts)
        if len(attempts) < 3:
            raise OSError("the disk hiccuped")

    runtime.add_handler("process.start", flaky)
    thread = thread_of(runtime)
    runtime.commands.start_process(thread, "command", "true")

    def settled() -> bool | None:
        with runtime.store.read() as reader:
            return True if not reader.outbox() and not reader.parked() else None

    await until(runtime, ["effects"], settled)
    assert attempts == [0, 1, 2], "each retry knows how often it failed before"


async def test_a_side_effect_that_keeps_failing_is_parked_shown_and_its_item_fails(runtime: Runtime) -> None:
    def broken(row: OutboxRow) -> None:
        raise OSError("no shell here")

    runtime.add_handler("process.start", broken)
    thread = thread_of(runtime)
    item_id = runtime.commands.start_process(thread, "command", "make test")["id"]

    def failed() -> Item | None:
        with runtime.store.read() as reader:
            item = reader.get(Item, item_id)
        return item if item is not None and item.status == ItemStatus.FAILED else None

    item = await until(runtime, [f"thread:{thread.thread_id}"], failed)
    assert "could not start: OSError: no shell here" in (item.reason or "")
    with runtime.store.read() as reader:
        parked = reader.parked(thread.thread_id)
        wake = [m for m in reader.find(Message, thread_id=thread.thread_id) if m.role == "notification"]
        runs = reader.find(Run, thread_id=thread.thread_id)
    assert [(row.kind, row.attempts, row.parked) for row in parked] == [("process.start", PARK_AFTER, True)]
    assert wake and runs, "the failure woke the thread: nothing waits on a parked effect"
    view = Queries(runtime.commands).thread(ADMIN, thread.thread_id or "")
    assert [e["kind"] for e in view["parkedEffects"]] == ["process.start"]
    assert Queries(runtime.commands).effects(ADMIN)["parked"][0]["lastError"] == "OSError: no shell here"


async def test_a_turn_that_cannot_start_fails_its_run_instead_of_leaving_it_running(runtime: Runtime) -> None:
    def broken(row: OutboxRow) -> None:
        raise RuntimeError("no provider process")

    runtime.add_handler("run.execute", broken)
    run_id = runtime.commands.create_thread(ADMIN, "script", "t", message="{}")["runId"]

    def ended() -> Run | None:
        with runtime.store.read() as reader:
            run = reader.get(Run, run_id)
        return run if run is not None and run.status == RunStatus.FAILED else None

    run = await until(runtime, ["events"], ended)
    assert run.error == "could not start the turn: RuntimeError: no provider process"


async def test_the_drain_is_supervised_a_crash_is_logged_and_it_starts_again(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime_module, "RESTART_DELAY", 0.01)
    original = runtime.commands.effects_done_soon  # what a process alone on its store calls
    crashes = []

    def crash_once(done: list[int]) -> None:
        if not crashes:
            crashes.append(1)
            raise RuntimeError("the store went away for a moment")
        original(done)

    monkeypatch.setattr(runtime.commands, "effects_done_soon", crash_once)
    spawned: list[str] = []
    runtime.add_handler("process.start", lambda row: spawned.append(row.payload["itemId"]))
    runtime.commands.start_process(thread_of(runtime), "command", "true")

    def drained() -> bool | None:
        with runtime.store.read() as reader:
            return True if not reader.outbox() else None

    await until(runtime, ["effects"], drained)
    assert crashes and "the outbox drain failed" in caplog.text
    assert len(spawned) == 2, "the crashed batch was carried out again (handlers are idempotent)"


async def test_a_carried_out_row_is_removed_later_and_never_carried_out_twice(runtime: Runtime) -> None:
    """Alone on its store, the drain removes what it carried out with the next command; until
    then the rows are still stored, and the drain (which reads again at once) skips them."""
    spawned: list[str] = []
    runtime.add_handler("process.start", lambda row: spawned.append(row.payload["itemId"]))
    thread = thread_of(runtime)
    items = [runtime.commands.start_process(thread, "command", "true")["id"] for _ in range(3)]

    def drained() -> bool | None:
        with runtime.store.read() as reader:
            return True if not reader.outbox() else None

    await until(runtime, ["effects"], drained)
    assert sorted(spawned) == sorted(items), "each row carried out exactly once"
    assert runtime._due_rows() == [] and not runtime._carried, "nothing left to skip"


async def test_a_long_script_turn_gives_the_loop_a_step_between_actions(runtime: Runtime) -> None:
    """Other work (on a shared store, the heartbeat) runs while a script turn of many actions
    runs: a process whose loop a turn holds past its lease is taken for gone (SPEC §12)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    actions = [{"reply": f"r{n}"} for n in range(100)]
    script = json.dumps({"tether_script": 1, "rules": [{"on": "start", "do": actions}]})
    ticker = asyncio.create_task(tick())
    run_id = runtime.commands.create_thread(ADMIN, "script", "t", message=script)["runId"]

    def completed() -> bool | None:
        with runtime.store.read() as reader:
            run = reader.get(Run, run_id)
        return True if run is not None and run.status == RunStatus.COMPLETED else None

    await until(runtime, ["events"], completed)
    ticker.cancel()
    assert ticks >= 99, f"the loop ran other work {ticks} times during a turn of 100 actions"


async def test_a_repeating_rules_later_runs_leave_the_script_state_alone(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is written when a run changes it (a rule fired the first time, an id
    recorded), not on every run: a parent woken a thousand times by the same repeating
    rule would rewrite its whole state (every task id it recorded) each time."""
    written: list[dict[str, Any]] = []
    set_state = runtime.commands.set_state
    monkeypatch.setattr(
        runtime.commands, "set_state", lambda caller, state: (written.append(state), set_state(caller, state))
    )
    rule = {"on": "any", "repeat": True, "do": [{"reply": "ok"}]}
    script = json.dumps({"tether_script": 1, "rules": [rule]})
    created = runtime.commands.create_thread(ADMIN, "script", "t", message=script)
    for text in ("two", "three"):
        runtime.commands.post_message(ADMIN, created["threadId"], text, mode="queue")

    def three_done() -> bool | None:
        with runtime.store.read() as reader:
            runs = reader.find(Run, thread_id=created["threadId"])
        return True if len(runs) == 3 and all(r.status == RunStatus.COMPLETED for r in runs) else None

    await until(runtime, ["events"], three_done)
    assert written == [{"fired": [0], "ids": {}, "tasks": {}}], "written by the first run only"


async def test_a_scripts_delegations_are_named_by_label_not_kept_in_its_state(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delegate's id is its task's label, which the task tools resolve: the parent's
    state is written once for the rule (not once per delegation, growing: a fan-out of a
    thousand rewrote a 30 KB state a thousand times), and its ids still name its tasks —
    in a later run too, as after a restart."""
    written: list[dict[str, Any]] = []
    set_state = runtime.commands.set_state
    monkeypatch.setattr(
        runtime.commands,
        "set_state",
        lambda caller, state: (written.append(json.loads(json.dumps(state))), set_state(caller, state)),
    )
    child = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "DONE"}]}]}
    delegations = [{"delegate": {"task": child, "id": f"c{n}", "title": f"child {n}"}} for n in range(5)]
    delegations.insert(0, {"bash": "true", "background": True, "id": "c3"})  # one ref, two kinds
    checks = [{"task_status": "c3"}, {"reply": "{{tasks.c3.status}} {{tasks.c3.result}}"}]
    rules = [{"on": "start", "do": delegations}, {"on": "delegated_task", "repeat": True, "do": checks}]
    script = json.dumps({"tether_script": 1, "rules": rules})
    created = runtime.commands.create_thread(ADMIN, "script", "t", message=script)

    def settled_with_a_reply() -> list[Run] | None:
        with runtime.store.read() as reader:
            thread = reader.get(Thread, created["threadId"])
            runs = reader.find(Run, thread_id=created["threadId"])
        wakes = [run for run in runs if run.kind == "delegated_task" and run.status == RunStatus.COMPLETED]
        return wakes if thread is not None and thread.settled and wakes else None

    wakes = await until(runtime, ["events"], settled_with_a_reply)
    assert {run.reply for run in wakes} == {"completed DONE"}, [r.reply for r in wakes]
    assert written[0] == {"fired": [0], "ids": {}, "tasks": {}}
    assert all(set(state["ids"]) <= {"c3"} for state in written), written  # the command's only
    assert not any(str(v).startswith("tsk_") for state in written for v in state["ids"].values())
    with runtime.store.read() as reader:
        labels = [t.label for t in reader.find(Task, parent_thread_id=created["threadId"])]
    assert labels == [f"c{n}" for n in range(5)]


async def test_the_files_of_ended_commands_go_after_the_retention_but_a_running_ones_stay(
    runtime: Runtime, tmp_path: Path
) -> None:
    """``prune_files`` (hourly, with the events' retention): an ended command's files go
    once all of them are older than the cutoff; a running command's stay however old."""
    thread = thread_of(runtime)
    flag = tmp_path / "go"
    running = runtime.commands.start_process(thread, "command", f"until [ -e {flag} ]; do sleep 0.01; done")
    ended = runtime.commands.start_process(thread, "command", "echo done")

    def status(item_id: str) -> str:
        with runtime.store.read() as reader:
            item = reader.get(Item, item_id)
        assert item is not None
        return item.status

    def files_of(view: dict[str, Any]) -> list[Path]:
        return sorted(runtime.processes.root.glob(f"{view['id']}.*"))

    await until(runtime, ["events"], lambda: status(ended["id"]) != ItemStatus.RUNNING or None)
    await until(runtime, ["events"], lambda: bool(files_of(running)) or None)
    assert files_of(ended) and files_of(running)
    _age_files(runtime.processes.root)
    assert runtime.prune_files(time.time() - 60) == 1
    assert files_of(ended) == [] and files_of(running), "only the ended command's files went"

    flag.touch()
    await until(runtime, ["events"], lambda: status(running["id"]) != ItemStatus.RUNNING or None)
    assert runtime.prune_files(time.time() - 60) == 0, "just written: kept"
    _age_files(runtime.processes.root)
    assert runtime.prune_files(time.time() - 60) == 1
    assert files_of(running) == []


def _age_files(root: Path) -> None:
    """As if every file in ``root`` was last written an hour ago."""
    hour_ago = time.time() - 3600
    for path in root.iterdir():
        os.utime(path, (hour_ago, hour_ago))
