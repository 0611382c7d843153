"""Translating between A2A and tether: a tether task as an A2A task (its status, text,
artifacts and references), an A2A message as tether input, and tether errors as A2A
error codes. Pure functions of what they are given, used by the handler and the routes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import (
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
    TransportProtocol,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import ParseDict
from google.protobuf.timestamp_pb2 import Timestamp

from tether import __version__
from tether.domain.records import Run, Task
from tether.engine.unit import View
from tether.environment import Environment
from tether.errors import Conflict, Forbidden, Invalid, NotFound, TetherError
from tether.types import Caller

#: Where A2A is served (the card names both bindings).
JSONRPC_PATH = "/a2a"
REST_PREFIX = "/a2a/v1"

STATES = {
    "queued": pb.TaskState.TASK_STATE_SUBMITTED,
    "running": pb.TaskState.TASK_STATE_WORKING,
    "completed": pb.TaskState.TASK_STATE_COMPLETED,
    "failed": pb.TaskState.TASK_STATE_FAILED,
    "interrupted": pb.TaskState.TASK_STATE_FAILED,
    "cancelled": pb.TaskState.TASK_STATE_CANCELED,
}


# ---------------------------------------------------------------------------- tether → A2A


def a2a_task(u: View, task: Task) -> pb.Task:
    """One tether task as an A2A task: state, the status message (interim, result or error),
    the result as an artifact, and for a follow-up the reference to the task it follows."""
    found = pb.Task(id=task.id, context_id=task.parent_thread_id)
    found.status.state = STATES[task.status]
    found.status.timestamp.CopyFrom(timestamp(task.completed_at or task.created_at))
    text = status_text(u, task)
    if text is not None:
        message = found.status.message
        message.message_id, message.role = f"{task.id}-status", pb.Role.ROLE_AGENT
        message.task_id, message.context_id = task.id, task.parent_thread_id
        message.parts.add(text=text)
        if task.follow_up_of:
            message.reference_task_ids.append(task.follow_up_of)
        found.history.append(message)
    result = (task.result or {}).get("text")
    if task.status == "completed" and result is not None:
        found.artifacts.add(artifact_id=f"{task.id}-result", name="result").parts.add(text=result)
    found.metadata.update(
        {"tether.status": task.status, "tether.childThreadId": task.child_thread_id}
        | ({"tether.followUpOf": task.follow_up_of} if task.follow_up_of else {})
    )
    return found


def status_text(u: View, task: Task) -> str | None:
    if task.is_open:
        return task.interim
    result = task.result or {}
    if task.status in ("failed", "interrupted"):
        run = u.load(Run, result.get("runId"))
        return (run.error if run else None) or result.get("text") or f"the task {task.status}"
    if task.status == "cancelled":
        return "cancelled"
    return result.get("text")


def timestamp(at: str) -> Timestamp:
    stamp = Timestamp()
    stamp.FromJsonString(at)
    return stamp


# ---------------------------------------------------------------------------- A2A → tether


def text_of(message: pb.Message) -> str:
    """The message's text parts, joined; a message without text is refused."""
    texts = [part.text for part in message.parts if part.WhichOneof("content") == "text"]
    text = "\n\n".join(t for t in texts if t.strip())
    if not text:
        raise InvalidParamsError("the message needs a non-empty text part (tether runs text tasks)")
    return text


def provider_of(params: pb.SendMessageRequest) -> str | None:
    """``tether.provider`` from the message's metadata (or the request's), if given."""
    for metadata in (params.message.metadata, params.metadata):
        value = metadata.fields.get("tether.provider")
        if value is not None:
            if value.WhichOneof("kind") != "string_value":
                raise InvalidParamsError("metadata 'tether.provider' must be a string")
            return value.string_value
    return None


@contextlib.contextmanager
def as_a2a_errors() -> Iterator[None]:
    """tether's errors as A2A's: unknown → task not found, bad input → invalid params."""
    try:
        yield
    except NotFound as error:
        raise TaskNotFoundError(error.message) from error
    except Invalid as error:
        raise InvalidParamsError(error.message) from error
    except (Conflict, Forbidden) as error:
        raise UnsupportedOperationError(error.message) from error
    except TetherError as error:
        raise InvalidRequestError(error.message) from error


def caller_of(context: ServerCallContext) -> Caller:
    return context.state["tether.caller"]


def changes(before: pb.Task | None, now: pb.Task) -> list[Any]:
    """Stream events from one task's last sent state to its current one: a new task whole,
    then a new result as an artifact update and a new status as a status update."""
    if before is None:
        return [now]
    events: list[Any] = []
    if now.artifacts != before.artifacts:
        events += [
            pb.TaskArtifactUpdateEvent(task_id=now.id, context_id=now.context_id, artifact=a, last_chunk=True)
            for a in now.artifacts
        ]
    if now.status.state != before.status.state or now.status.message != before.status.message:
        events.append(pb.TaskStatusUpdateEvent(task_id=now.id, context_id=now.context_id, status=now.status))
    return events


def push_config(stored: dict[str, Any], task_id: str) -> pb.TaskPushNotificationConfig:
    found = ParseDict(stored, pb.TaskPushNotificationConfig(), ignore_unknown_fields=True)
    found.task_id = task_id
    return found


def last_event_id(context: ServerCallContext) -> int | None:
    """The ``Last-Event-ID`` a reconnecting stream client sent, if any."""
    raw = context.state.get("headers", {}).get("last-event-id")
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidParamsError(f"Last-Event-ID must be an event id this server sent, not {raw!r}")
    return int(raw)


def trim_history(task: pb.Task, length: int) -> None:
    if length < 0:
        raise InvalidParamsError("historyLength must not be negative")
    del task.history[: max(len(task.history) - length, 0)]


def agent_card(env: Environment, base_url: str) -> pb.AgentCard:
    """The environment as an A2A agent: its providers as skills, both bindings, Bearer auth."""
    card = pb.AgentCard(
        name=env.name,
        description=(
            f"tether environment {env.name} ({env.environment_id}): agent threads that run tasks "
            "and always deliver the answer — a late answer arrives as a follow-up task in the "
            "same context, referencing the original."
        ),
        version=__version__,
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )
    card.provider.organization, card.provider.url = "tether", base_url
    card.capabilities.streaming = True
    card.capabilities.push_notifications = True
    card.capabilities.extended_agent_card = True
    bindings = ((TransportProtocol.JSONRPC, JSONRPC_PATH), (TransportProtocol.HTTP_JSON, REST_PREFIX))
    for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3):  # 0.3 clients read the card too
        for binding, path in bindings:
            card.supported_interfaces.add(
                url=f"{base_url}{path}", protocol_binding=binding.value, protocol_version=version
            )
    for name in env.runtime.providers:
        card.skills.add(
            id=name,
            name=f"{name} agent",
            description=f"a tether thread on the {name} provider (message metadata tether.provider={name!r})",
            tags=["tether", name],
        )
    scheme = card.security_schemes["bearer"].http_auth_security_scheme
    scheme.scheme, scheme.description = "Bearer", "tether's admin token or a link token (tether token create)"
    card.security_requirements.add().schemes["bearer"].SetInParent()
    return card
