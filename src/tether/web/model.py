"""What the web page shows, as pure functions over the API's own views.

Every function here takes the JSON views that ``GET /api/threads``, ``GET /api/threads/{id}``
and ``GET /api/tasks`` answer (built by :mod:`tether.domain.views`, with ``attention`` from
:mod:`tether.domain.attention` and ``ledger`` from :mod:`tether.domain.ledger`) and turns
them into rows and cards for the templates. Nothing is derived twice: a thread's group is
its ``attention``, a ledger row is the API's ledger row. The same functions render a thread
of a linked environment, whose views arrive through the link.

:func:`affected` maps a batch of events of the feed to the fragments they change; the live
feed re-renders those from the store, so a duplicate or late event re-renders the same
fragment with the same id and can never add a second row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tether.domain.attention import ORDER
from tether.ids import parse_time

GROUP_TITLES = {
    "needs_input": "Needs input",
    "working": "Working",
    "waiting": "Waiting",
    "failed": "Failed",
    "settled": "Settled",
}
GROUP_HINTS = {
    "needs_input": "only a person can move these on",
    "working": "a run is queued or running",
    "waiting": "idle, but held work or open tasks will wake them",
    "failed": "the last run failed; nothing will wake them",
    "settled": "finished; nothing will wake them",
}
OPEN = ("queued", "running")


# ---------------------------------------------------------------------- context


@dataclass
class Context:
    """Where a view comes from, and how to link to threads from there.

    ``here`` is the environment whose records the view shows; ``local`` is the environment
    serving the page; ``linked`` are the environments it links to (id → name).
    """

    local: str
    local_name: str
    linked: dict[str, str] = field(default_factory=dict)
    here: str | None = None

    @property
    def source(self) -> str:
        return self.here or self.local

    @property
    def remote(self) -> bool:
        return self.source != self.local

    def name(self, environment_id: str | None) -> str:
        if not environment_id or environment_id == self.local:
            return self.local_name
        return self.linked.get(environment_id, environment_id)

    def thread_href(self, environment_id: str | None, thread_id: str | None) -> str | None:
        """A link to a thread wherever it lives: here, or through a link of this server."""
        if not thread_id:
            return None
        environment_id = environment_id or self.source
        if environment_id == self.local:
            return f"/threads/{thread_id}"
        if environment_id in self.linked:
            return f"/env/{environment_id}/threads/{thread_id}"
        return None


# ---------------------------------------------------------------------- time


def elapsed(start: str | None, end: str | None = None, now: datetime | None = None) -> str:
    """``"4 s"``, ``"3 min 2 s"``, ``"2 h 5 min"``."""
    if not start:
        return ""
    stop = parse_time(end) if end else (now or datetime.now(UTC))
    return seconds_text((stop - parse_time(start)).total_seconds())


def seconds_text(seconds: float) -> str:
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


def short(text: str | None, limit: int = 120) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ---------------------------------------------------------------------- threads list


def thread_row(
    summary: Mapping[str, Any],
    ctx: Context,
    background: int | None = None,
    parent_title: str | None = None,
) -> dict[str, Any]:
    """One row of the threads list, from a thread summary (``GET /api/threads``). A child of
    a thread here (whichever environment the child runs in) goes into its parent's row."""
    environment_id = summary.get("environmentId") or ctx.source
    local = environment_id == ctx.local
    thread_id = summary["threadId"]
    attention = summary.get("attention") or "settled"
    since = summary.get("attentionSince")
    parent = summary.get("parentThreadId")
    nested = bool(parent) and summary.get("parentEnvironmentId") == ctx.local
    return {
        "id": ("thread-" if local else "rthread-") + thread_id,
        "threadId": thread_id,
        "href": ctx.thread_href(environment_id, thread_id),
        "title": summary.get("title") or (f"task of “{parent_title}”" if parent_title else "untitled"),
        "provider": summary.get("provider"),
        "environment": ctx.name(environment_id),
        "local": local,
        "attention": attention,
        "since": since if attention in ("working", "waiting") else None,
        "status": summary.get("status"),
        "taskId": summary.get("taskId"),
        "parent": parent,
        "parentTitle": parent_title,
        "parentHref": ctx.thread_href(summary.get("parentEnvironmentId"), parent),
        "background": background,
        "order": summary.get("createdAt") or "",
        "container": f"kids-{parent}" if nested else f"group-{attention}",
        "kidsId": f"kids-{thread_id}",
        "kids": [],
        "stale": summary.get("stale"),
        **run_flags(summary, attention),
    }


def group_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups in the order of what needs a person, each a list of trees: a thread with
    the threads its tasks created inside it (oldest first), roots newest first. A child
    whose parent is not in the list stands in its own group."""
    rows = list(rows)
    by_kids = {row["kidsId"]: row for row in rows}
    groups: dict[str, list[dict[str, Any]]] = {name: [] for name in ORDER}
    for row in sorted(rows, key=lambda r: r["order"]):
        parent = by_kids.get(row["container"])
        if parent is not None and parent is not row:
            parent["kids"].append(row)
            continue
        row["container"] = f"group-{row['attention']}"
        groups.setdefault(row["attention"], []).append(row)
    return [
        {
            "name": name,
            "title": GROUP_TITLES.get(name, name),
            "hint": GROUP_HINTS.get(name, ""),
            "rows": found[::-1],
            "open": name != "settled",
        }
        for name, found in groups.items()
    ]


def run_flags(summary: Mapping[str, Any], attention: str) -> dict[str, Any]:
    """What the thread's last answer run says beside its group: why it failed, or that it
    was stopped or cut off by a restart (never a green "settled" alone)."""
    last = summary.get("lastRun")
    return {
        "flags": thread_flags(last),
        "failure": (last or {}).get("error") if attention == "failed" else None,
    }


# ---------------------------------------------------------------------- triggers


def _code(text: str | None) -> str:
    return f"`{short(text, 80)}`" if text else "a command"


def trigger_label(
    run: Mapping[str, Any],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]],
    ctx: Context | None = None,
) -> str:
    """Why a run started, in a person's words: ``woken: command `npm test` exited 0``."""
    trigger = run.get("trigger") or {}
    kind = trigger.get("kind")
    inputs = [messages[m] for m in trigger.get("messageIds") or [] if m in messages]
    sources = [m.get("source") or {} for m in inputs]
    if kind == "user":
        return "message from a person"
    if kind == "task":
        origin = next((s.get("origin") for s in sources if s.get("origin")), None) or {}
        where = f" in {ctx.name(origin.get('environmentId'))}" if ctx and origin.get("environmentId") else ""
        return f"started: delegated task from thread {origin.get('threadId', '?')}{where}"
    if kind == "message":
        origin = next((s.get("origin") for s in sources if s.get("origin")), None) or {}
        where = f" in {ctx.name(origin.get('environmentId'))}" if ctx and origin.get("environmentId") else ""
        return f"message from thread {origin.get('threadId') or '?'}{where}"
    if kind in ("background_command", "monitor_finished", "monitor_event"):
        return _item_label(kind, sources, inputs, items)
    if kind == "scheduled":
        texts = [short(m.get("text"), 60) for m in inputs]
        return "woken: scheduled wake" + (f" “{texts[0]}”" if texts and texts[0] else "")
    if kind == "delegated_task":
        return _wake_label(trigger.get("taskIds") or [], tasks)
    if kind == "restart":
        lost = [s for s in sources if s.get("itemId")]
        if lost:
            item = items.get(lost[0]["itemId"]) or {}
            what = f"{item.get('kind', 'work')} {_code(item.get('command'))}"
            return f"woken: tether restarted and {what} was lost"
        return "woken: tether restarted during a run"
    return f"trigger {kind}"


def _item_label(
    kind: str,
    sources: list[Mapping[str, Any]],
    inputs: list[Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> str:
    with_item = [s for s in sources if s.get("itemId")]
    item = items.get(with_item[-1]["itemId"], {}) if with_item else {}
    command = _code(item.get("command") or item.get("label"))
    if kind == "monitor_event":
        lines = sum(len((m.get("text") or "").splitlines()) for m in inputs)
        return f"progress: monitor {command} printed {lines} line{'s' if lines != 1 else ''}"
    ending = next(
        (s for s in reversed(with_item) if s.get("kind") == kind), with_item[-1] if with_item else {}
    )
    code = ending.get("exitCode")
    if code is None:
        code = item.get("exitCode")
    if kind == "background_command":
        how = f"exited {code}" if code is not None else f"ended ({item.get('reason') or item.get('status')})"
        return f"woken: command {command} {how}"
    how = f"exit {code}" if code is not None else item.get("reason") or item.get("status") or "ended"
    return f"woken: monitor {command} ended ({how})"


def _wake_label(task_ids: list[str], tasks: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for task_id in task_ids:
        task = tasks.get(task_id) or {}
        title = f" “{task['title']}”" if task.get("title") else f" {task_id}"
        kind = "follow-up of task" if task.get("followUpOf") else "task"
        parts.append(f"{kind}{title} {task.get('status', 'finished')}")
    return "woken: " + ("; ".join(parts) if parts else "a delegated task finished")


# ---------------------------------------------------------------------- a thread


#: Lines (and progress replies) of a monitor shown in its group on the thread page; the
#: rest are on the monitor's own page, so a thread page stays small however long it ran.
RECENT_LINES = 20


def timeline(view: Mapping[str, Any], ctx: Context, now: datetime | None = None) -> list[dict[str, Any]]:
    """A thread's timeline, oldest first: each run with the messages that started it (shown)
    and what it wrote (folded to "worked for N s"), and each task it delegated as a card
    right after the run that delegated it, its follow-ups inside. A monitor's progress runs
    are one group, placed at its latest activity (:func:`monitor_entry`)."""
    messages = {m["messageId"]: m for m in view.get("messages") or []}
    items = {i["id"]: i for i in view.get("background") or []}
    tasks = {t["taskId"]: t for t in view.get("tasks") or []}
    runs = list(view.get("runs") or [])
    thread_id = view["threadId"]
    entries: list[dict[str, Any]] = []
    keys: dict[str, str] = {}
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    progress: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for message in messages.values():
        by_run.setdefault(message.get("runId") or "", []).append(message)
    for number, run in enumerate(runs, 1):
        inputs = [messages[m] for m in run["trigger"].get("messageIds") or [] if m in messages]
        key = f"{run['queuedAt']}|{number:06d}"
        keys[run["runId"]] = key
        if run["trigger"].get("kind") == "monitor_event":
            progress.setdefault(monitor_of(inputs), []).append((number, run))
            continue
        input_ids = {m["messageId"] for m in inputs}
        outputs = [m for m in by_run.get(run["runId"], []) if m["messageId"] not in input_ids]
        entry = run_entry(run, inputs, outputs, messages, items, tasks, ctx, key, thread_id, now)
        entries.append({**entry, "number": number})
    for item_id, group in progress.items():
        entries.append(monitor_entry(item_id, group, messages, items, thread_id, keys[group[-1][1]["runId"]]))
    for message in by_run.get("", []):
        entries.append(
            {
                "kind": "message",
                "id": f"msg-{message['messageId']}",
                "order": f"{message['createdAt']}|",
                "container": f"timeline-{thread_id}",
                "message": message,
            }
        )
    roots = [t for t in tasks.values() if not t.get("followUpOf") or t["followUpOf"] not in tasks]
    for task in roots:
        follow_ups = [t for t in tasks.values() if t.get("followUpOf") == task["taskId"]]
        creator = _creating_run(task, runs)
        order = (keys[creator["runId"]] if creator else task["createdAt"]) + f"|task|{task['createdAt']}"
        entries.append(task_card(task, follow_ups, ctx, order, thread_id))
    entries.sort(key=lambda e: e["order"])
    return entries


def monitor_of(inputs: Iterable[Mapping[str, Any]]) -> str:
    """The monitor whose lines started a progress run ("" when its messages do not say)."""
    found = ((m.get("source") or {}).get("itemId") for m in inputs)
    return next((item_id for item_id in found if item_id), "")


def monitor_log(
    group: list[tuple[int, Mapping[str, Any]]], messages: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A monitor's lines and the progress replies they drew, oldest first."""
    log: list[dict[str, Any]] = []
    for number, run in group:
        for message_id in run["trigger"].get("messageIds") or []:
            text = (messages.get(message_id) or {}).get("text") or ""
            log += [{"kind": "line", "text": line} for line in text.splitlines()]
        if run.get("reply") is not None:
            log.append({"kind": "reply", "text": run["reply"], "number": number})
    return log


def monitor_entry(
    item_id: str,
    group: list[tuple[int, Mapping[str, Any]]],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    thread_id: str,
    order: str,
    limit: int | None = RECENT_LINES,
) -> dict[str, Any]:
    """Every progress run of one monitor, as one live group: its latest line and reply in
    view, the last ``limit`` lines and replies in a fold, the rest on its own page."""
    item = items.get(item_id) or {}
    log = monitor_log(group, messages)
    lines = [row for row in log if row["kind"] == "line"]
    replies = [row for row in log if row["kind"] == "reply"]
    last_number, last_run = group[-1]
    active = last_run["status"] in OPEN
    return {
        "kind": "monitor",
        "id": f"monitor-{item_id or thread_id}",
        "itemId": item_id,
        "order": order,
        "container": f"timeline-{thread_id}",
        "runIds": [run["runId"] for _, run in group],
        "command": item.get("command") or item.get("label") or "a monitor",
        "itemStatus": item.get("status"),
        "running": item.get("status") == "running",
        "persistent": item.get("persistent"),
        "runs": len(group),
        "lineCount": len(lines),
        "latestLine": short(lines[-1]["text"], 200) if lines else None,
        "latestReply": replies[-1]["text"] if replies else None,
        "numbers": (group[0][0], last_number),
        "active": active,
        "activeStatus": last_run["status"] if active else None,
        "failed": sum(1 for _, run in group if run["status"] == "failed"),
        "shown": log if limit is None else log[-limit:],
        "hidden": 0 if limit is None else max(0, len(log) - limit),
        "since": item.get("startedAt"),
    }


def monitor_page(view: Mapping[str, Any], item_id: str) -> dict[str, Any] | None:
    """One monitor's whole log (lines and progress replies), for its own page."""
    messages = {m["messageId"]: m for m in view.get("messages") or []}
    items = {i["id"]: i for i in view.get("background") or []}
    group = []
    for number, run in enumerate(view.get("runs") or [], 1):
        inputs = [messages[m] for m in run["trigger"].get("messageIds") or [] if m in messages]
        if run["trigger"].get("kind") == "monitor_event" and monitor_of(inputs) == item_id:
            group.append((number, run))
    if not group:
        return None
    return monitor_entry(item_id, group, messages, items, view["threadId"], "", limit=None)


def _creating_run(task: Mapping[str, Any], runs: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = None
    for run in runs:
        if run.get("progress"):
            continue
        started = run.get("startedAt")
        if started and started <= task["createdAt"]:
            found = run
    return found


def run_entry(
    run: Mapping[str, Any],
    inputs: list[Mapping[str, Any]],
    outputs: list[Mapping[str, Any]],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]],
    ctx: Context,
    order: str,
    thread_id: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    status = run["status"]
    started, ended = run.get("startedAt"), run.get("endedAt")
    if status == "queued":
        worked = "queued"
    elif status == "running":
        worked = "working for"
    elif started and ended:
        worked = f"worked for {elapsed(started, ended)}"
    else:
        worked = "never started"
    reply = run.get("reply")
    state, words = run_state(run)
    # The reply is shown outside the fold; an assistant message with the same text is not
    # shown twice.
    folded = [m for m in outputs if not (m.get("role") == "assistant" and m.get("text") == reply)]
    return {
        "kind": "run",
        "id": f"run-{run['runId']}",
        "order": order,
        "container": f"timeline-{thread_id}",
        "run": run,
        "seq": run.get("seq"),
        "label": trigger_label(run, messages, items, tasks, ctx),
        "triggerKind": run["trigger"].get("kind"),
        "inputs": [m for m in inputs if m.get("role") == "user"],
        "notifications": [m for m in inputs if m.get("role") != "user"],
        "folded": folded,
        "reply": reply,
        "error": run.get("error") if status == "failed" else None,
        "why": run.get("error") if status in ("interrupted", "cancelled") else None,
        "status": status,
        "state": state,
        "stateWords": words,
        "worked": worked,
        "since": started or run.get("queuedAt") if status in OPEN else None,
        "progress": bool(run.get("progress")),
    }


RESTARTED = "restarted"


def run_state(run: Mapping[str, Any] | None) -> tuple[str, str]:
    """A run's status for a person: a run cut off by a restart, or stopped on purpose, is
    neither a failure nor a success (``(css class, words)``)."""
    if run is None:
        return "none", "no run yet"
    status, error = run.get("status") or "", run.get("error") or ""
    if status == "interrupted" and "restart" in error:
        return RESTARTED, "interrupted by a restart"
    if status == "interrupted":
        return "stopped", "stopped"
    return status, status


def thread_flags(last_run: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Badges a thread's last answer run earns beside its group: cut off by a restart,
    stopped on purpose."""
    if not last_run:
        return []
    state, words = run_state(last_run)
    if state in (RESTARTED, "stopped"):
        return [{"css": state, "words": words}]
    if last_run.get("trigger") == "restart":
        return [{"css": RESTARTED, "words": "resumed after a restart"}]
    return []


def deadline_fields(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task's deadline (SPEC §11), when the task view has one: ``deadlineAt`` for a
    countdown while it is open, ``overdue`` once it passed."""
    open_ = task.get("status") in OPEN
    return {
        "deadlineAt": task.get("deadlineAt") if open_ and not task.get("overdue") else None,
        "overdue": bool(task.get("overdue")) and open_,
    }


def answer_rows(task: Mapping[str, Any], follow_ups: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The task's answers as its parent received them: the result, then each follow-up
    (the one that carried the final answer last)."""
    rows = []
    for n, found in enumerate([task, *follow_ups]):
        result = found.get("result") or {}
        rows.append(
            {
                "taskId": found["taskId"],
                "as": "result" if n == 0 else "follow-up",
                "status": found["status"],
                "open": found["status"] in OPEN,
                "text": result.get("text"),
                "error": result.get("error"),
                "interim": found.get("interim"),
            }
        )
    return rows


def task_card(
    task: Mapping[str, Any],
    follow_ups: list[Mapping[str, Any]],
    ctx: Context,
    order: str,
    thread_id: str,
) -> dict[str, Any]:
    """A delegated task: the child's current or final status and result, and where it lives."""
    child_env = task.get("childEnvironmentId")
    latest = follow_ups[-1] if follow_ups else task
    answers = answer_rows(task, follow_ups)
    ended = latest.get("completedAt") if latest["status"] not in OPEN else None
    return {
        **deadline_fields(latest),
        "answers": answers,
        "latestStatus": latest["status"],
        "cancelId": latest["taskId"],  # the open one: the task, or its open follow-up
        "error": next((a["error"] for a in reversed(answers) if a["error"]), None),
        "elapsed": elapsed(task["createdAt"], ended),
        "since": task["createdAt"] if latest["status"] in OPEN else None,
        "kind": "task",
        "id": f"task-{task['taskId']}",
        "order": order,
        "container": f"timeline-{thread_id}",
        "task": task,
        "title": task.get("title") or task["taskId"],
        "status": task["status"],
        "workState": task.get("workState"),
        "open": task["status"] in OPEN or latest["status"] in OPEN,
        # Ended, but its child still has work that will wake it: a follow-up may come.
        "childActive": bool(latest.get("childActive")) and latest["status"] not in OPEN,
        "environment": ctx.name(child_env),
        "remote": child_env != ctx.local,
        "childHref": ctx.thread_href(child_env, task.get("childThreadId")),
        "progress": (task.get("progress") or [])[-1]["text"] if task.get("progress") else None,
        "followUps": len(follow_ups),
    }


def background_rows(
    view: Mapping[str, Any], ctx: Context, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Each command, monitor, schedule and task of the thread: what, where, status, how long,
    its latest output or progress line, and whether it can be stopped. Running work is in
    ``background-{thread}``; ended work moves to the folded ``background-ended-{thread}``."""
    tasks = {t["taskId"]: t for t in view.get("tasks") or []}
    rows = []
    for item in view.get("background") or []:
        row = _item_fields(item, tasks, ctx)
        running = row["status"] in OPEN
        started, ended = row.pop("times")
        place = "background" if running else "background-ended"
        rows.append(
            {
                **row,
                "id": f"item-{item['id']}",
                "itemId": item["id"],
                "container": f"{place}-{view['threadId']}",
                "order": f"{item['startedAt']}|{item['id']}",
                "kind": item["kind"],
                "label": item.get("label"),
                "running": running,
                "held": item.get("held"),
                "startedAt": started,
                "endedAt": ended,
                "elapsed": elapsed(started, ended, now),
                "taskId": item.get("taskId"),
                "stoppable": running,
            }
        )
    return rows


def _item_fields(
    item: Mapping[str, Any], tasks: Mapping[str, Mapping[str, Any]], ctx: Context
) -> dict[str, Any]:
    """What a background row says about one item: a task by its latest answer and its own
    times, a schedule by its countdown, a command or monitor by its last line or exit."""
    kind, status = item["kind"], item["status"]
    times = (item["startedAt"], item.get("endedAt"))
    until = None
    if kind == "task":
        task = tasks.get(item.get("taskId") or "")
        latest = _latest(task, tasks) if task else None
        what = item.get("label") or (task or {}).get("title") or item.get("taskId")
        target = ctx.name(item.get("environmentId"))
        status = latest["status"] if latest else status
        line = _task_line(latest)
        if task is not None and latest is not None:
            times = (task["createdAt"], latest.get("completedAt") if status not in OPEN else None)
        # a Stop ends the task the child works on now: the latest follow-up, if any
        extra = {**deadline_fields(latest or {}), "cancelId": (latest or {}).get("taskId")}
    elif kind == "schedule":
        what = item.get("text") or "scheduled wake"
        target = ctx.name(ctx.source)
        until = item.get("dueAt") if status == "running" else None
        line = None if until else item.get("reason")
        extra = {}
    else:
        what = item.get("command") or item.get("label") or item["id"]
        target = ctx.name(ctx.source)
        line = item.get("lastLine")
        if item.get("exitCode") is not None and status != "running":
            line = f"exit {item['exitCode']}" + (f" · {line}" if line else "")
        elif item.get("reason") and status != "running":
            line = item["reason"] + (f" · {line}" if line else "")
        extra = {}
    return {
        **extra,
        "what": what,
        "target": target,
        "status": status,
        "latest": short(line, 160),
        "until": until,
        "times": times,
    }


def _latest(task: Mapping[str, Any], tasks: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The task's latest follow-up (or the task): the one whose answer the parent got last."""
    follow_ups = [tasks[f] for f in task.get("followUps") or [] if f in tasks]
    return follow_ups[-1] if follow_ups else task


def _task_line(task: Mapping[str, Any] | None) -> str | None:
    if task is None:
        return None
    result = task.get("result") or {}
    if result.get("text") is not None:
        return str(result["text"])
    if result.get("error"):
        return f"failed: {result['error']}"
    if task.get("progress"):
        return task["progress"][-1].get("text")
    return task.get("interim") or task.get("workState")


LEDGER_WORDS = {
    "result": "as the result",
    "follow-up": "as a follow-up",
    "pending": "pending",
    "cancelled": "cancelled",
    "call": "returned to the waiting call",
    "disposed": "not delivered (the thread itself cancelled it)",
}


def ledger_rows(view: Mapping[str, Any], ctx: Context) -> list[dict[str, Any]]:
    """The API's ledger rows (``view["ledger"]``), with links and words for the page."""
    rows = []
    roots: dict[str, str] = {}
    for entry in view.get("ledger") or []:
        root = entry.get("followUpOf")
        if not root:
            roots[entry["taskId"]] = entry["createdAt"]
        order = f"{roots.get(root or entry['taskId'], entry['createdAt'])}|{root or entry['taskId']}|"
        if root:
            order += entry["createdAt"]
        wake = entry.get("wake") or None
        rows.append(
            {
                **entry,
                "id": f"ledger-{entry['taskId']}",
                "container": f"ledger-{view['threadId']}",
                "order": order,
                "how": LEDGER_WORDS.get(entry["reachedAs"], entry["reachedAs"]),
                "environment": ctx.name(entry.get("childEnvironmentId")),
                "childHref": ctx.thread_href(entry.get("childEnvironmentId"), entry.get("childThreadId")),
                "wakeText": (
                    f"woke run #{wake['runSeq']} ({wake['runStatus']})"
                    if wake and wake.get("runSeq") is not None
                    else ("wake: " + wake["state"] if wake else "no wake yet")
                ),
                "result": short(entry.get("resultText"), 200),
            }
        )
    return rows


def thread_head(
    view: Mapping[str, Any], ctx: Context, own_task: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    attention = view.get("attention") or ("settled" if view.get("settled") else "working")
    running = [i for i in view.get("background") or [] if i["status"] == "running"]
    waiting_for = [
        f"{i['kind']} “{short(i.get('command') or i.get('label') or i.get('text') or i['id'], 60)}”"
        for i in running
    ] + [
        f"task “{t.get('title') or t['taskId']}” (its child is still at work: a follow-up may come)"
        for t in view.get("tasks") or []
        if t.get("childActive") and t["status"] not in OPEN
    ]
    active = [r for r in view.get("runs") or [] if r["status"] in OPEN]
    return {
        "id": f"head-{view['threadId']}",
        "threadId": view["threadId"],
        "title": view.get("title") or "untitled",
        "environment": ctx.name(view.get("environmentId") or ctx.source),
        "provider": view.get("provider"),
        "model": view.get("model"),
        "status": view.get("status"),
        "attention": attention,
        "attentionTitle": GROUP_TITLES.get(attention, attention),
        "since": view.get("attentionSince") if attention in ("working", "waiting") else None,
        "parentId": view.get("parentThreadId"),
        "parentHref": ctx.thread_href(view.get("parentEnvironmentId"), view.get("parentThreadId")),
        "parentEnvironment": ctx.name(view.get("parentEnvironmentId"))
        if view.get("parentThreadId")
        else None,
        "taskId": view.get("taskId"),
        "ownTask": own_task,
        "background": len(running),
        "activeRuns": [{"runId": r["runId"], "seq": r.get("seq"), "status": r["status"]} for r in active],
        "running": any(r["status"] == "running" for r in active),
        "cancelled": view.get("cancelled"),
        "waitingFor": waiting_for if attention == "waiting" else [],
        **run_flags(view, attention),
    }


# ---------------------------------------------------------------------- the live feed


def affected(
    events: Iterable[Mapping[str, Any]], view: str, subject: str | None, local: str
) -> set[tuple[str, ...]]:
    """The fragments a batch of events changes, for one view of the page.

    ``events`` are the feed's events (``{type, threadId, runId, taskId, data}``) in any
    order, duplicates included: the answer is a set of keys, and each key is re-rendered
    from the store as it is *now*, so a late or repeated event changes nothing more.

    Keys: ``("row", threadId)``, ``("remote-row", environmentId, threadId)``,
    ``("summary",)`` for the threads list; ``("head",)``, ``("run", runId)``,
    ``("task", rootTaskId)``, ``("item", itemId)``, ``("ledger", taskId)`` for a thread;
    ``("reload",)`` for a thread of a linked environment.
    """
    keys: set[tuple[str, ...]] = set()
    for event in events:
        kind = event.get("type") or ""
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        thread_id = event.get("threadId")
        if view == "threads":
            keys.add(("summary",))
            if thread_id:
                keys.add(("row", thread_id))
            if kind.startswith("task."):
                if data.get("parentEnvironmentId") == local and data.get("parentThreadId"):
                    keys.add(("row", data["parentThreadId"]))
                child_env, child = data.get("childEnvironmentId"), data.get("childThreadId")
                if child and child_env == local:
                    keys.add(("row", child))
                elif child and child_env:
                    keys.add(("remote-row", child_env, child))
        elif view == "thread":
            keys |= _thread_keys(kind, data, event, subject)
        elif view == "remote" and kind.startswith("task.") and data.get("childThreadId") == subject:
            keys.add(("reload",))
    return keys


def _thread_keys(
    kind: str, data: Mapping[str, Any], event: Mapping[str, Any], subject: str | None
) -> set[tuple[str, ...]]:
    keys: set[tuple[str, ...]] = set()
    mine = event.get("threadId") == subject
    if kind.startswith("task."):
        if data.get("parentThreadId") == subject:
            keys.add(("task", data.get("followUpOf") or data.get("taskId") or ""))
            keys.add(("ledger", data.get("taskId") or ""))
            if data.get("followUpOf"):
                keys.add(("ledger", data["followUpOf"]))
            keys.add(("head",))
        if data.get("childThreadId") == subject:
            keys.add(("head",))
        return keys
    if not mine:
        return keys
    keys.add(("head",))
    if kind.startswith("run."):
        run_id = event.get("runId") or data.get("runId")
        if run_id:
            keys.add(("run", run_id))
        trigger = data.get("trigger") or {}
        for task_id in trigger.get("taskIds") or []:
            keys.add(("ledger", task_id))
    elif kind.startswith("message."):
        run_id = data.get("runId") or event.get("runId")
        if run_id:
            keys.add(("run", run_id))
    elif kind.startswith("item."):
        if data.get("id"):
            keys.add(("item", data["id"]))
        if data.get("taskId"):
            keys.add(("task", data["taskId"]))
    return keys
