"""The page's model and its live feed, without a browser: a recorded event log of probe 1
(played on the real commands over a temporary store, this test acting as the provider),
the fragments each batch of events re-renders, and a model of the page that applies them
as ``tether.js`` does — replace the element with the fragment's id, or insert it into its
container by order. Late batches, duplicate batches and a replay from an old cursor must
all end in exactly the page a fresh load shows: nothing missed, nothing doubled.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.api.events import event_json
from tether.engine.commands import Commands
from tether.engine.queries import Queries
from tether.store.sqlite import SQLiteStore
from tether.types import ADMIN, Caller
from tether.web import model
from tether.web.render import thread_fragments, thread_model

ENV = "env_here"
CTX = model.Context(ENV, "here")
ACTIONS = {"actions": "/ui/threads/x", "task_actions": "/ui/tasks", "item_actions": "/ui/items", "here": "/"}


class Probe1:
    """Probe 1 of SPEC §8, local: the child answers WAITING, its background command ends,
    it answers FINAL as a follow-up. A snapshot of the parent after every step."""

    def __init__(self, path: Path) -> None:
        self.store = SQLiteStore(path)
        self.commands = Commands(self.store, ENV, frozenset({"script"}))
        self.queries = Queries(self.commands)
        self.snapshots: list[tuple[int, dict[str, Any]]] = []

    def running(self, thread_id: str) -> str:
        return next(
            r["runId"] for r in self.queries.thread(ADMIN, thread_id)["runs"] if r["status"] == "running"
        )

    def snap(self) -> None:
        self.snapshots.append((self.store.last_event_seq(), self.queries.thread(ADMIN, self.parent)))

    def play(self) -> None:
        made = self.commands.create_thread(ADMIN, "script", title="parent", message="go")
        self.parent = made["threadId"]
        self.snap()
        as_parent = Caller("thread", thread_id=self.parent, run_id=made["runId"])
        task = self.commands.delegate(as_parent, "the job", provider="script", title="probe 1")
        self.task, self.child = task["taskId"], task["childThreadId"]
        self.snap()
        self.commands.end_run(made["runId"], "completed", "delegated")
        self.snap()
        child_run = self.running(self.child)
        as_child = Caller("thread", thread_id=self.child, run_id=child_run)
        self.item = self.commands.start_process(as_child, "command", "npm test", spawn=False)["id"]
        self.commands.end_run(child_run, "completed", "WAITING")
        self.snap()
        self.commands.end_run(self.running(self.parent), "completed", "got WAITING")
        self.snap()
        self.commands.process_ended(self.item, 0)
        self.snap()
        self.commands.end_run(self.running(self.child), "completed", "FINAL")
        self.snap()
        self.commands.end_run(self.running(self.parent), "completed", "got FINAL")
        self.snap()

    def events(self) -> list[dict[str, Any]]:
        return [event_json(e, ENV) for e in self.store.events_after(0, 100_000)]


class Monitor(Probe1):
    """A thread whose persistent monitor prints in bursts: progress runs, some folding lines
    while one runs, then the monitor's end. The monitor's group moves down the timeline
    with each new progress run."""

    def play(self) -> None:
        made = self.commands.create_thread(ADMIN, "script", title="watcher", message="go")
        self.parent = made["threadId"]
        as_thread = Caller("thread", thread_id=self.parent, run_id=made["runId"])
        item = self.commands.start_process(
            as_thread, "monitor", "tail -f build.log", persistent=True, spawn=False
        )
        self.snap()
        self.commands.end_run(made["runId"], "completed", "WATCHING")
        self.snap()
        for burst in range(4):
            self.commands.monitor_output(item["id"], [f"line {burst}a", f"line {burst}b"], burst + 1)
            self.snap()
            if burst % 2:  # a second burst folds into the queued progress run
                self.commands.monitor_output(item["id"], [f"line {burst}c"], burst + 1)
                self.snap()
            self.commands.end_run(self.running(self.parent), "completed", f"PROGRESS {burst}")
            self.snap()
        self.commands.post_message(ADMIN, self.parent, "how is it going?")  # queued behind it
        self.snap()
        for reply in ("PROGRESS 4", "going well"):
            self.commands.end_run(self.running(self.parent), "completed", reply)
            self.snap()
        self.commands.monitor_output(item["id"], ["line 4a"], 5)  # the group moves below
        self.snap()
        self.commands.end_run(self.running(self.parent), "completed", "PROGRESS 5")
        self.snap()
        self.commands.process_ended(item["id"], 0)
        self.snap()
        self.commands.end_run(self.running(self.parent), "completed", "DONE")
        self.snap()


@pytest.fixture(params=[Probe1, Monitor], ids=["probe1", "monitor"])
def probe(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Probe1]:
    found = request.param(tmp_path / "tether.db")
    found.play()
    yield found
    found.store.close()


@pytest.fixture
def probe1(tmp_path: Path) -> Iterator[Probe1]:
    found = Probe1(tmp_path / "tether.db")
    found.play()
    yield found
    found.store.close()


# ---------------------------------------------------------------------- a model of the page


_TIME = re.compile(r"(<time[^>]*>)[^<]*(</time>)|worked for [^<]*")


class Page:
    """What ``tether.js`` does with fragments, on a page of containers and fixed slots."""

    def __init__(self, fragments: list[dict[str, Any]], containers: set[str]) -> None:
        self.html: dict[str, str] = {}
        self.version: dict[str, int] = {}
        self.where: dict[str, str | None] = {}
        self.children: dict[str, list[tuple[str, str]]] = {c: [] for c in containers}
        for fragment in fragments:  # the server-rendered page, in its own order
            self.html[fragment["id"]] = fragment["html"]
            self.where[fragment["id"]] = fragment["container"]
            if fragment["container"] is not None:
                self.children[fragment["container"]].append((fragment["order"], fragment["id"]))

    def apply(self, fragments: list[dict[str, Any]]) -> None:
        for fragment in fragments:
            key, container = fragment["id"], fragment["container"]
            if "v" in fragment and self.version.get(key, -1) > fragment["v"]:
                continue  # an older state never replaces a newer one
            self.version[key] = fragment.get("v", -1)
            in_place = key in self.html and (
                container is None
                or (self.where[key] == container and (fragment["order"], key) in self.children[container])
            )
            if in_place:
                self.html[key] = fragment["html"]
                continue
            if container not in self.children:
                continue
            if key in self.html:
                old = self.where[key]
                self.children[old] = [c for c in self.children[old] if c[1] != key]  # type: ignore[index]
            siblings = self.children[container]
            place = next(
                (n for n, (order, _) in enumerate(siblings) if order > fragment["order"]), len(siblings)
            )
            siblings.insert(place, (fragment["order"], key))
            self.html[key] = fragment["html"]
            self.where[key] = container

    def shape(self) -> dict[str, Any]:
        """Ids in order per container and every element's html (elapsed times masked)."""
        return {
            "containers": {c: [key for _, key in kids] for c, kids in self.children.items()},
            "html": {key: _TIME.sub("", html) for key, html in self.html.items()},
        }


def fragments_of(view: dict[str, Any], keys: set[tuple[str, ...]] | None) -> list[dict[str, Any]]:
    return thread_fragments(thread_model(view, CTX), keys, **ACTIONS)


def containers(view: dict[str, Any]) -> set[str]:
    thread_id = view["threadId"]
    return {
        f"timeline-{thread_id}",
        f"background-{thread_id}",
        f"background-ended-{thread_id}",
        f"ledger-{thread_id}",
    }


def fresh(view: dict[str, Any]) -> Page:
    return Page(fragments_of(view, None), containers(view))


def batches(events: list[dict[str, Any]], after: int) -> Iterator[list[dict[str, Any]]]:
    rng = random.Random(after)
    pending = [e for e in events if int(e["id"]) > after]
    while pending:
        size = rng.randint(1, 6)
        yield pending[:size]
        pending = pending[size:]


def view_at(probe: Probe1, seq: int) -> dict[str, Any]:
    """The parent as the server reads it once the events up to ``seq`` are committed."""
    return next(view for at, view in probe.snapshots if at >= seq)


# ---------------------------------------------------------------------- tests


def test_the_parent_is_never_settled_before_final(probe1: Probe1) -> None:
    states = [view["attention"] for _, view in probe1.snapshots]
    assert states == ["working", "working", "waiting", "working", "waiting", "waiting", "working", "settled"]
    last = probe1.snapshots[-1][1]
    assert [(r["reachedAs"], r["resultText"]) for r in last["ledger"]] == [
        ("result", "WAITING"),
        ("follow-up", "FINAL"),
    ]


def test_trigger_labels_and_folds(probe1: Probe1) -> None:
    view = probe1.snapshots[-1][1]
    entries = model.timeline(view, CTX)
    runs = [e for e in entries if e["kind"] == "run"]
    assert [e["label"] for e in runs] == [
        "message from a person",
        "woken: task “probe 1” completed",
        "woken: follow-up of task “probe 1” completed",
    ]
    assert all(e["worked"].startswith("worked for ") for e in runs)
    card = next(e for e in entries if e["kind"] == "task")
    assert entries.index(card) == 1  # right after the run that delegated it
    assert [(a["as"], a["text"]) for a in card["answers"]] == [("result", "WAITING"), ("follow-up", "FINAL")]
    assert card["childHref"] == f"/threads/{probe1.child}"
    child = probe1.queries.thread(ADMIN, probe1.child)
    labels = [e["label"] for e in model.timeline(child, CTX) if e["kind"] == "run"]
    assert labels[1] == "woken: command `npm test` exited 0"


@pytest.mark.parametrize("start", range(8))
def test_live_batches_from_any_page_end_in_the_fresh_page(probe: Probe1, start: int) -> None:
    """The page loads at snapshot ``start``; the feed then sends every later batch, some of
    them late (rendered from a later state), some twice, and a reconnect replays from an
    older cursor. The result is exactly the page a fresh load of the final state shows."""
    events = probe.events()
    cursor, view = probe.snapshots[start]
    page = fresh(view)
    rng = random.Random(start)
    sent: list[list[dict[str, Any]]] = []
    for batch in batches(events, cursor):
        sent.append(batch)
        now_seq = int(batch[-1]["id"])
        if rng.random() < 0.3:  # rendered late: the store has moved on since these events
            now_seq = probe.snapshots[min(len(probe.snapshots) - 1, rng.randrange(len(probe.snapshots)))][0]
            now_seq = max(now_seq, int(batch[-1]["id"]))
        state = view_at(probe, now_seq)
        keys = model.affected(batch, "thread", probe.parent, ENV)
        page.apply(fragments_of(state, keys))
        if rng.random() < 0.3:  # the same batch again (a duplicate delivery)
            page.apply(fragments_of(state, keys))
    final = probe.snapshots[-1][1]
    # a reconnect from an older cursor replays what was already applied
    for batch in batches(events, cursor // 2):
        page.apply(fragments_of(final, model.affected(batch, "thread", probe.parent, ENV)))
    assert page.shape() == fresh(final).shape()


def test_affected_ignores_order_and_duplicates(probe1: Probe1) -> None:
    events = probe1.events()
    shuffled = events + events[::-1]
    random.Random(1).shuffle(shuffled)
    for view, subject in (("thread", probe1.parent), ("thread", probe1.child), ("threads", None)):
        assert model.affected(shuffled, view, subject, ENV) == model.affected(events, view, subject, ENV)
    keys = model.affected(events, "thread", probe1.parent, ENV)
    final = probe1.snapshots[-1][1]
    for run in final["runs"]:
        assert ("run", run["runId"]) in keys
    for task in final["tasks"]:
        assert ("ledger", task["taskId"]) in keys
    assert ("task", probe1.task) in keys and ("head",) in keys
    assert {("item", i["id"]) for i in final["background"]} <= keys
    rows = model.affected(events, "threads", None, ENV)
    assert {("row", probe1.parent), ("row", probe1.child), ("summary",)} <= rows


def test_a_remote_child_s_task_events_name_its_row_and_its_page() -> None:
    event = {
        "type": "task.updated",
        "threadId": "thr_p",
        "data": {
            "taskId": "tsk_1",
            "parentEnvironmentId": ENV,
            "parentThreadId": "thr_p",
            "childEnvironmentId": "env_far",
            "childThreadId": "thr_c",
        },
    }
    assert model.affected([event], "threads", None, ENV) == {
        ("summary",),
        ("row", "thr_p"),
        ("remote-row", "env_far", "thr_c"),
    }
    assert model.affected([event], "remote", "thr_c", ENV) == {("reload",)}
    assert model.affected([event], "remote", "thr_other", ENV) == set()
    assert ("ledger", "tsk_1") in model.affected([event], "thread", "thr_p", ENV)


def test_links_to_threads_wherever_they_live() -> None:
    ctx = model.Context(ENV, "here", {"env_far": "far"})
    assert ctx.thread_href(ENV, "thr_1") == "/threads/thr_1"
    assert ctx.thread_href("env_far", "thr_2") == "/env/env_far/threads/thr_2"
    assert ctx.thread_href("env_unknown", "thr_3") is None
    remote = model.Context(ENV, "here", {"env_far": "far"}, here="env_far")
    assert remote.thread_href(None, "thr_4") == "/env/env_far/threads/thr_4"
    assert remote.name("env_far") == "far" and remote.name(ENV) == "here"


def test_elapsed_words() -> None:
    assert model.seconds_text(4.9) == "4 s"
    assert model.seconds_text(62) == "1 min 2 s"
    assert model.seconds_text(7300) == "2 h 1 min"
    assert model.elapsed("2026-01-01T00:00:00.000Z", "2026-01-01T00:00:12.500Z") == "12 s"
    assert model.elapsed(None) == ""


def _row(thread_id: str, attention: str, created: str, parent: str | None = None, env: str = ENV) -> Any:
    summary = {"threadId": thread_id, "attention": attention, "createdAt": created, "environmentId": env}
    if parent:
        summary |= {"parentThreadId": parent, "parentEnvironmentId": ENV}
    return model.thread_row(summary, model.Context(ENV, "here", {"env_far": "far"}))


def test_groups_in_the_order_of_what_needs_a_person() -> None:
    rows = [
        _row(f"thr_{o}", a, o)
        for a, o in (
            ("settled", "1"),
            ("working", "2"),
            ("needs_input", "3"),
            ("waiting", "4"),
            ("working", "5"),
        )
    ]
    groups = model.group_rows(rows)
    assert [g["name"] for g in groups] == ["needs_input", "working", "waiting", "failed", "settled"]
    assert [r["order"] for r in groups[1]["rows"]] == ["5", "2"]  # newest first
    assert [g["open"] for g in groups] == [True, True, True, True, False]  # settled is folded


def test_children_nest_under_their_parent_wherever_they_run() -> None:
    parent = _row("thr_p", "waiting", "1")
    here = _row("thr_a", "working", "2", parent="thr_p")
    far = _row("thr_b", "failed", "3", parent="thr_p", env="env_far")
    grandchild = _row("thr_c", "settled", "4", parent="thr_a")
    orphan = _row("thr_d", "settled", "5", parent="thr_gone")
    groups = {g["name"]: g["rows"] for g in model.group_rows([far, grandchild, orphan, here, parent])}
    assert [r["threadId"] for r in groups["waiting"]] == ["thr_p"]
    assert [r["threadId"] for r in parent["kids"]] == ["thr_a", "thr_b"]  # oldest first
    assert [r["threadId"] for r in here["kids"]] == ["thr_c"]
    assert far["container"] == "kids-thr_p" and far["id"] == "rthread-thr_b"
    assert [r["threadId"] for r in groups["settled"]] == ["thr_d"]  # its parent is not listed
    assert groups["failed"] == [] and groups["working"] == []


def test_a_monitor_s_progress_runs_are_one_group_at_its_latest_line(tmp_path: Path) -> None:
    play = Monitor(tmp_path / "tether.db")
    try:
        play.play()
    finally:
        play.store.close()
    orders = []
    for _, view in play.snapshots:
        groups = [e for e in model.timeline(view, CTX) if e["kind"] == "monitor"]
        assert len(groups) <= 1
        orders += [g["order"] for g in groups]
    assert len(set(orders)) == 6  # it moved with each of the 6 progress runs
    final = play.snapshots[-1][1]
    assert final["attention"] == "settled"
    entries = model.timeline(final, CTX)
    assert [e["kind"] for e in entries] == ["run", "run", "monitor", "run"]  # below the message
    group = entries[2]
    assert (group["runs"], group["lineCount"], group["latestReply"]) == (6, 11, "PROGRESS 5")
    assert group["latestLine"] == "line 4a" and group["hidden"] == 0
    messages = {m["messageId"]: m for m in final["messages"]}
    progress = [(n, r) for n, r in enumerate(final["runs"], 1) if r["trigger"]["kind"] == "monitor_event"]
    small = model.monitor_entry(group["itemId"], progress, messages, {}, play.parent, "o", limit=3)
    assert [row["text"] for row in small["shown"]] == ["PROGRESS 4", "line 4a", "PROGRESS 5"]
    assert small["hidden"] == 11 + 6 - 3  # 11 lines and 6 replies in all


async def test_a_failed_read_of_a_linked_row_shows_the_last_one_seen() -> None:
    """A peer that stops answering (here: nothing listens on its port) keeps its rows,
    marked stale with the error, instead of dropping the update."""
    from tether.peers.client import PeerClient
    from tether.web import remote

    class Link:  # what the page reads of a peer: its name, id and client
        environment_id = "env_gone"
        link = type("L", (), {"name": "gone", "status": "ok"})()
        client = PeerClient("http://127.0.0.1:9", "ttl_x", "gone")

    summary = {
        "threadId": "thr_r",
        "environmentId": "env_gone",
        "title": "remote job",
        "attention": "working",
    }
    remote._remember("env_gone", [summary], complete=True)
    try:
        found = await remote.thread_summary(Link(), "thr_r")  # type: ignore[arg-type]
        unknown = await remote.thread_summary(Link(), "thr_new")  # type: ignore[arg-type]
    finally:
        await Link.client.aclose()
    assert found["title"] == "remote job" and found["attention"] == "working"
    assert "gone is unreachable" in found["stale"]["error"] and found["stale"]["seenAt"]
    row = model.thread_row(found, model.Context(ENV, "here", {"env_gone": "gone"}))
    assert row["stale"] and row["id"] == "rthread-thr_r"
    assert unknown["stale"] and unknown["threadId"] == "thr_new"
