"""The JSON shapes of records (SPEC §4). Pure functions; the API, the event feed and the
tools all render records through these, so every surface shows the same fields."""

from __future__ import annotations

from typing import Any

from tether.domain.records import Item, Message, Run, Task, Thread


def run_view(run: Run) -> dict[str, Any]:
    return {
        "runId": run.id,
        "threadId": run.thread_id,
        "status": run.status,
        "trigger": {k: v for k, v in run.trigger.items() if k != "key"},
        "reply": run.reply,
        "error": run.error,
        "queuedAt": run.queued_at,
        "startedAt": run.started_at,
        "endedAt": run.ended_at,
        "progress": run.is_progress,
    }


def message_view(message: Message) -> dict[str, Any]:
    return {
        "messageId": message.id,
        "threadId": message.thread_id,
        "position": message.seq,
        "role": message.role,
        "text": message.text,
        "source": message.source,
        "runId": message.run_id,
        "createdAt": message.created_at,
    }


def item_view(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "kind": item.kind,
        "label": item.label,
        "status": item.status,
        "held": item.held,
        "command": item.command,
        "awaited": item.awaited,
        "persistent": item.persistent,
        "exitCode": item.exit_code,
        "reason": item.reason,
        "lastLine": item.last_line,
        "dueAt": item.due_at,
        "text": item.text,
        "taskId": item.task_id,
        "environmentId": item.environment_id,
        "startedAt": item.started_at,
        "endedAt": item.ended_at,
    }


def task_view(task: Task) -> dict[str, Any]:
    return {
        "taskId": task.id,
        "title": task.title,
        "label": task.label,
        "parentEnvironmentId": task.parent_environment_id,
        "parentThreadId": task.parent_thread_id,
        "childEnvironmentId": task.child_environment_id,
        "childThreadId": task.child_thread_id,
        "mode": task.mode,
        "hold": task.hold,
        "status": task.status,
        "workState": task.work_state,
        "interim": task.interim,
        "result": task.result,
        "progress": list(task.progress),
        "followUpOf": task.follow_up_of,
        "followUps": list(task.follow_ups),
        "delivery": {
            "state": task.delivery_state,
            "wakeMessageId": task.wake_message_id,
            "wakeRunId": task.wake_run_id,
            "deliveredAs": task.delivered_as,
        },
        "createdAt": task.created_at,
        "completedAt": task.completed_at,
        "childActive": task.child_active,
        "deadlineAt": task.deadline_at,
        "onDeadline": task.on_deadline,
        "overdue": task.overdue,
        "remoteTaskId": task.remote_task_id,
    }


def thread_summary(thread: Thread, environment_id: str) -> dict[str, Any]:
    return {
        "threadId": thread.id,
        "environmentId": environment_id,
        "provider": thread.provider,
        "model": thread.model,
        "title": thread.title,
        "status": thread.status,
        "settled": thread.settled,
        "parentEnvironmentId": (thread.parent or {}).get("environmentId"),
        "parentThreadId": (thread.parent or {}).get("threadId"),
        "taskId": thread.root_task_id,
        "cancelled": thread.cancelled,
        "createdAt": thread.created_at,
    }
