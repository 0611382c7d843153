"""A real A2A agent for the consuming tests, built from the ``a2a-sdk`` server classes: its
own ``AgentExecutor`` behind the SDK's ``DefaultRequestHandler`` and JSON-RPC routes, over
real HTTP. Run as a subprocess: ``python a2a_agent.py DIR PORT [PUBLIC_URL] [TOKEN]``.

A task's message is JSON: ``{"gate": G, "answer": A, "late": L}``. The agent answers
"working", waits until the file ``DIR/gates/G`` exists, then completes with the artifact A.
With ``late``, it waits for ``DIR/gates/G.late`` after that and then writes its late
answer the way A2A allows one: a **new task in the same context** whose messages carry
``referenceTaskIds`` naming the first.

It is durable like a real deployment: its tasks are kept in ``DIR/tasks.json`` (the SDK's
in-memory store, saved on every change) and its jobs in ``DIR/jobs``; after a restart it
takes the unfinished ones up again (through the store: the stream of a job that was
running is gone, so a client has to poll — the fallback tether's follower uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import UnsupportedOperationError
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from tether.launch import free_port

GATE_POLL = 0.02  # the agent's own wait for its gate file (the job it "runs")


class FileTaskStore(InMemoryTaskStore):
    """The SDK's store, saved to a file on every change and loaded at start."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.saved: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}

    async def load(self) -> None:
        for body in self.saved.values():
            await super().save(ParseDict(body, pb.Task()), ServerCallContext())

    async def save(self, task: pb.Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self.saved[task.id] = MessageToDict(task)
        self.path.with_suffix(".tmp").write_text(json.dumps(self.saved))
        self.path.with_suffix(".tmp").replace(self.path)


def agent_message(text: str, task: pb.Task, refs: list[str] | None = None) -> pb.Message:
    message = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.Role.ROLE_AGENT, task_id=task.id, context_id=task.context_id
    )
    message.parts.add(text=text)
    message.reference_task_ids.extend(refs or [])
    return message


class GateAgent(AgentExecutor):
    def __init__(self, data: Path, store: FileTaskStore) -> None:
        self.data, self.store = data, store
        (data / "jobs").mkdir(parents=True, exist_ok=True)
        (data / "gates").mkdir(exist_ok=True)

    async def gate(self, name: str) -> None:
        while not (self.data / "gates" / name).exists():
            await asyncio.sleep(GATE_POLL)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        spec = json.loads(context.get_user_input())
        task = pb.Task(id=context.task_id or "", context_id=context.context_id or "")
        task.status.state = pb.TaskState.TASK_STATE_SUBMITTED
        task.history.append(context.message)
        await event_queue.enqueue_event(task)
        (self.data / "jobs" / f"{task.id}.json").write_text(
            json.dumps({"spec": spec, "taskId": task.id, "contextId": task.context_id})
        )
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work(agent_message("working on it", task))
        await self.gate(spec["gate"])
        await updater.add_artifact([pb.Part(text=spec["answer"])], name="answer")
        await updater.complete()
        if spec.get("late"):
            asyncio.get_running_loop().create_task(self.late(task, spec))
        else:
            (self.data / "jobs" / f"{task.id}.json").unlink()

    async def late(self, task: pb.Task, spec: dict[str, Any]) -> None:
        """The late answer: a new task in the context, referencing the first."""
        await self.gate(spec["gate"] + ".late")
        late = pb.Task(id=str(uuid.uuid4()), context_id=task.context_id)
        message = agent_message(spec["late"], late, [task.id])
        late.status.state = pb.TaskState.TASK_STATE_COMPLETED
        late.status.message.CopyFrom(message)
        late.status.timestamp.GetCurrentTime()
        late.history.append(message)
        late.artifacts.add(artifact_id=str(uuid.uuid4()), name="answer").parts.add(text=spec["late"])
        await self.store.save(late, ServerCallContext())
        (self.data / "jobs" / f"{task.id}.json").unlink()

    async def resume(self) -> None:
        """After a restart: finish the jobs that were running, through the store."""
        for path in (self.data / "jobs").glob("*.json"):
            job = json.loads(path.read_text())
            task = await self.store.get(job["taskId"], ServerCallContext())
            if task is None:
                continue
            if task.status.state == pb.TaskState.TASK_STATE_COMPLETED:
                asyncio.get_running_loop().create_task(self.late(task, job["spec"]))
            else:
                asyncio.get_running_loop().create_task(self.finish(task, job["spec"]))

    async def finish(self, task: pb.Task, spec: dict[str, Any]) -> None:
        await self.gate(spec["gate"])
        task.artifacts.add(artifact_id=str(uuid.uuid4()), name="answer").parts.add(text=spec["answer"])
        task.status.state = pb.TaskState.TASK_STATE_COMPLETED
        task.status.ClearField("message")
        task.status.timestamp.GetCurrentTime()
        await self.store.save(task, ServerCallContext())
        if spec.get("late"):
            await self.late(task, spec)
        else:
            (self.data / "jobs" / f"{task.id}.json").unlink()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise UnsupportedOperationError("this agent finishes what it starts")


def card(url: str) -> pb.AgentCard:
    found = pb.AgentCard(name="gatekeeper", description="waits for a gate, answers, answers again later")
    found.version = "1.0"
    found.capabilities.streaming = True
    found.default_input_modes.append("text/plain")
    found.default_output_modes.append("text/plain")
    found.supported_interfaces.add(url=f"{url}/a2a", protocol_binding="JSONRPC", protocol_version="1.0")
    found.skills.add(id="gate", name="gate", description="waits for a gate file", tags=["test"])
    return found


def app(data: Path, url: str, token: str | None) -> Any:
    store = FileTaskStore(data / "tasks.json")
    agent = GateAgent(data, store)
    handler = DefaultRequestHandler(agent_executor=agent, task_store=store, agent_card=card(url))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await store.load()
        await agent.resume()
        yield

    routes = [*create_agent_card_routes(card(url)), *create_jsonrpc_routes(handler, "/a2a")]
    server = Starlette(routes=routes, lifespan=lifespan)

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        """With a token, every A2A call needs it as a Bearer token (the card stays public)."""
        headers = dict(scope.get("headers") or [])
        wanted = f"Bearer {token}".encode()
        if (
            token
            and scope["type"] == "http"
            and scope["path"] == "/a2a"
            and headers.get(b"authorization") != wanted
        ):
            await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
            return
        await server(scope, receive, send)

    return guarded


class AgentProcess:
    """The agent as a subprocess, for tests: ``start()`` (again after ``kill()``, same port
    and data), ``kill()`` is SIGKILL, ``open(gate)`` lets a job go on."""

    def __init__(self, data: Path, public_url: str | None = None, token: str | None = None) -> None:
        self.data, self.token = data, token
        self.port = free_port()
        self.public_url = public_url
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> AgentProcess:
        self.data.mkdir(parents=True, exist_ok=True)
        args = [
            str(self.data),
            str(self.port),
            self.public_url or self.url,
            *([self.token] if self.token else []),
        ]
        with open(self.data.parent / "agent.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the A2A agent exited: see {self.data.parent / 'agent.log'}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/.well-known/agent-card.json", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.05)  # the process is still starting: nothing to await yet
        self.kill()
        raise RuntimeError(f"the A2A agent did not answer within {timeout}s")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def open(self, gate: str) -> None:
        (self.data / "gates").mkdir(parents=True, exist_ok=True)
        (self.data / "gates" / gate).touch()

    def task_states(self) -> dict[str, str]:
        """The agent's own view of its tasks (its store's file): id → state name."""
        path = self.data / "tasks.json"
        saved = json.loads(path.read_text()) if path.exists() else {}
        return {task_id: body["status"]["state"] for task_id, body in saved.items()}


if __name__ == "__main__":
    directory, port = Path(sys.argv[1]), int(sys.argv[2])
    public = sys.argv[3] if len(sys.argv) > 3 else f"http://127.0.0.1:{port}"
    secret = sys.argv[4] if len(sys.argv) > 4 else None
    directory.mkdir(parents=True, exist_ok=True)
    uvicorn.run(app(directory, public, secret), host="127.0.0.1", port=port, log_level="warning")
