"""The records tether keeps. Plain dataclasses: the store serialises them as JSON.

Field names are the snake_case twins of the API's camelCase fields; ``tether.api.views``
renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Self

from tether.domain.types import (
    ACTIVE_RUN,
    OPEN_TASK,
    Delivery,
    ItemKind,
    ItemStatus,
    RunStatus,
    TaskStatus,
    Trigger,
    WorkState,
)


class Record:
    """Mixin: round-trip through plain dicts (and so JSON).

    Shallow on purpose: records hold only JSON values, and ``dataclasses.asdict``'s deep
    copy was the single largest cost of every write.
    """

    _names: tuple[str, ...] = ()
    _known: frozenset[str] = frozenset()

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._names = ()  # filled on first use, once the dataclass decorator has run

    @classmethod
    def _fields(cls) -> tuple[str, ...]:
        if not cls._names:
            cls._names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
            cls._known = frozenset(cls._names)
        return cls._names

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        cls._fields()
        if data.keys() <= cls._known:  # the usual case: a record this version wrote
            return cls(**data)
        return cls(**{k: v for k, v in data.items() if k in cls._known})


@dataclass
class Thread(Record):
    id: str
    provider: str
    created_at: str
    title: str | None = None
    #: The model the provider should use (None: the provider's configured default).
    model: str | None = None
    #: ``{environmentId, threadId, taskId}`` when a delegated task created this thread.
    parent: dict[str, Any] | None = None
    #: The task this thread was created to do (its root task), if any.
    root_task_id: str | None = None
    #: The root task or follow-up currently open for this child, if any.
    open_task_id: str | None = None
    #: The latest task (root or follow-up) of this child, open or not.
    latest_task_id: str | None = None
    #: The link token that created this thread (the fence of G10), if any.
    token_id: str | None = None
    #: Set by ``task_cancel``: later replies of this child open no follow-ups.
    cancelled: bool = False
    #: Set by ``thread_interrupt``: the open task ends ``interrupted`` when it settles.
    interrupted: bool = False
    #: The last non-progress run that ended since the last answer was taken.
    pending_answer_run_id: str | None = None
    status: str = "idle"
    settled: bool = True
    #: Provider-private state that must survive restarts (the script's fired rules ...).
    state: dict[str, Any] = field(default_factory=dict)
    run_count: int = 0
    message_count: int = 0


@dataclass
class Run(Record):
    id: str
    thread_id: str
    seq: int
    trigger: dict[str, Any]
    queued_at: str
    status: str = RunStatus.QUEUED
    reply: str | None = None
    error: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    #: The tether process (``Runtime.member``) whose provider turn this run is: only it can
    #: stop the turn, and if it is gone for good the run is interrupted (SPEC §12).
    member: str | None = None

    @property
    def kind(self) -> str:
        return self.trigger["kind"]

    @property
    def is_progress(self) -> bool:
        """A progress run reports monitor output; its reply is never an answer (G4)."""
        return self.kind == Trigger.MONITOR_EVENT

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_RUN


@dataclass
class Message(Record):
    id: str
    thread_id: str
    seq: int
    role: str
    text: str
    created_at: str
    source: dict[str, Any] | None = None
    run_id: str | None = None


@dataclass
class Item(Record):
    """A background item: command, monitor, scheduled wake or delegated task."""

    id: str
    thread_id: str
    kind: str
    started_at: str
    status: str = ItemStatus.RUNNING
    label: str | None = None
    command: str | None = None
    awaited: bool = False
    persistent: bool = False
    hold: bool = False
    timeout_ms: int | None = None
    exit_code: int | None = None
    ended_at: str | None = None
    # processes
    #: Who runs the process: None for tether (a wrapper it spawned), else the provider
    #: whose agent runs it itself (Claude Code's background Bash or Monitor).
    runner: str | None = None
    pid: int | None = None
    pid_start: str | None = None
    #: The tether process (``Runtime.member``) that spawned it, or whose turn started the
    #: agent that runs it: only that process can watch or kill it (SPEC §12).
    member: str | None = None
    offset: int = 0
    last_line: str | None = None
    # schedules
    due_at: str | None = None
    text: str | None = None
    # delegated tasks
    task_id: str | None = None
    environment_id: str | None = None
    #: Why it ended, for the wake text ("timeout", "killed", "lost on restart" ...).
    reason: str | None = None

    @property
    def is_running(self) -> bool:
        return self.status == ItemStatus.RUNNING

    @property
    def held(self) -> bool:
        """Held work keeps its thread unsettled (SPEC §1)."""
        if not self.is_running:
            return False
        match self.kind:
            case ItemKind.COMMAND:
                return self.awaited
            case ItemKind.MONITOR:
                return not self.persistent
            case ItemKind.SCHEDULE | ItemKind.TASK:
                return self.hold
        return False


@dataclass
class Task(Record):
    id: str
    parent_environment_id: str
    parent_thread_id: str
    child_environment_id: str
    child_thread_id: str
    created_at: str
    title: str | None = None
    #: The parent's own name for the task (a script's ``delegate`` id): its tools accept it
    #: wherever the task id goes. Kept here, not in the parent's state, which it would grow
    #: by one entry per delegation — and that state is rewritten whole at each one.
    label: str | None = None
    mode: str = "async"
    hold: bool = True
    status: str = TaskStatus.QUEUED
    work_state: str = WorkState.WORKING
    interim: str | None = None
    result: dict[str, Any] | None = None
    progress: list[dict[str, Any]] = field(default_factory=list)
    follow_up_of: str | None = None
    follow_ups: list[str] = field(default_factory=list)
    delivery_state: str = Delivery.PENDING
    wake_message_id: str | None = None
    wake_run_id: str | None = None
    #: A wait-mode call is blocked on this task: its result goes to that call, not a wake.
    waiting_call: bool = False
    completed_at: str | None = None
    #: For the ledger: how the result reached the parent ("result", "follow-up", "call").
    delivered_as: str | None = None
    #: A remote child's task: the call its peer still has to receive ("create", "cancel").
    remote_pending: str | None = None
    #: What the peer needs to create the child: ``{task, provider}``.
    remote_request: dict[str, Any] | None = None
    #: The child still has a run or background work that will wake it (latest task only):
    #: even once this task ended, a follow-up may come, so the parent still waits.
    child_active: bool = False
    #: When the parent stops waiting without news (SPEC §11); kept by the origin.
    deadline_at: str | None = None
    #: What the deadline does: "wake" the parent once, or "cancel" the task.
    on_deadline: str = "wake"
    #: The deadline passed while the task was open (it fired; it never fires again).
    overdue: bool = False
    #: Why it was cancelled ("deadline", a person's reason ...), also told to a remote child.
    cancel_reason: str | None = None
    #: A2A push notification configs (SPEC §14), on the root task of an A2A context: every
    #: task of the context (its follow-ups too) is pushed to each.
    push: list[dict[str, Any]] = field(default_factory=list)
    #: The remote task's id, for a child that is an A2A agent (SPEC §14): its own id there
    #: (the A2A context id is ``child_thread_id``).
    remote_task_id: str | None = None

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_TASK


@dataclass
class Token(Record):
    id: str
    label: str
    hash: str
    created_at: str
    kind: str = "link"
    thread_id: str | None = None
    expires_at: str | None = None
    last_used_at: str | None = None
    revoked: bool = False
    #: The feed position the holder has acknowledged by reading past it (link tokens).
    acked_seq: int = 0


@dataclass
class Link(Record):
    environment_id: str
    name: str
    url: str
    token: str
    created_at: str
    label: str | None = None
    status: str = "ok"
    last_error: str | None = None
    cursor: str | None = None
    #: "tether" (another environment: its API and event feed) or "a2a" (an A2A agent).
    kind: str = "tether"


@dataclass
class Send(Record):
    """A message for a thread in a linked environment, kept until the peer has taken it,
    so a ``thread_send`` made while the link is down flows once it heals (G7)."""

    id: str
    environment_id: str
    thread_id: str
    text: str
    created_at: str
    mode: str = "auto"
    origin: dict[str, Any] | None = None
    status: str = "pending"  # pending | sent | failed
    result: dict[str, Any] | None = None
    error: str | None = None
