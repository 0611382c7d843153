"""G6 across a link: SIGKILL the origin or the destination while a remote child waits on a
background command, start it again, and the parent still gets the child's answer exactly
once. A command whose process survived is adopted and reported as usual; one whose
process is gone is reported by a ``restart`` run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from linkkit import (
    assert_delivered_once,
    await_delivered,
    await_finished,
    await_on,
    first_run_done_with_command,
    parent_of,
    remote_child_started,
)

from kit import (
    leftover_wrappers,
    link,
    new_thread,
    poll,
    process_gone,
    recorded_exit,
    recorded_pid,
    start_all,
    tasks_of,
    thread,
    wake_messages,
)
from tether.launch import Server

WAITING = {"reply": "WAITING"}


def _child(command: str, on_restart: bool = False) -> dict[str, Any]:
    """Probe 1's child. ``on_restart``: the answer comes from a ``restart`` run instead, and
    a ``background_command`` run would say so."""
    start = {"on": "start", "do": [{"bash": command, "background": True, "id": "b1"}, WAITING]}
    final = [{"reply": "FINAL"}]
    if not on_restart:
        return {"tether_script": 1, "rules": [start, {"on": "background_command", "do": final}]}
    return {"tether_script": 1, "rules": [
        start,
        {"on": "restart", "do": final},
        {"on": "background_command", "do": [{"reply": "NOT THE ANSWER"}]},
    ]}


def _gated(gate: Path) -> str:
    """A command that runs until the test creates ``gate``: it ends when the test says so,
    whatever the machine's speed (the loop is the command's own, not the test's)."""
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK"


@pytest.fixture(scope="module")
def pair(module_servers: Any) -> dict[str, Server]:
    origin, peer = module_servers("origin"), module_servers("peer")
    start_all([origin, peer])
    link(origin, peer)
    return {"origin": origin, "peer": peer}


@pytest.fixture
def up(pair: dict[str, Server]) -> dict[str, Server]:
    """Both servers running (a failed test may have left one down)."""
    for server in pair.values():
        if server.process is None or server.process.poll() is not None:
            server.start()
    return pair


def _answered(peer: Server, child_id: str, reply: str) -> Any:
    def check() -> dict[str, Any] | None:
        view = thread(peer, child_id)
        done = [r for r in view["runs"] if r["status"] == "completed" and r["reply"] == reply]
        return view if done and view["settled"] else None

    return await_on(peer, check, 30, f"child {child_id} to answer {reply}")


def _command(view: dict[str, Any]) -> dict[str, Any]:
    return next(i for i in view["background"] if i["kind"] == "command")


def test_origin_killed_while_remote_child_waits(up: dict[str, Server], tmp_path: Path) -> None:
    origin, peer = up["origin"], up["peer"]
    gate = tmp_path / "gate"
    parent_id = new_thread(origin, parent_of(_child(_gated(gate)), "peer"))
    child_id, _ = remote_child_started(origin, peer, parent_id, first_run_done_with_command)

    origin.kill()
    gate.touch()
    # the child answers while its origin is down: the destination keeps it in its feed
    child = _answered(peer, child_id, "FINAL")
    assert [r["trigger"]["kind"] for r in child["runs"]] == ["task", "background_command"]

    origin.start()
    tasks, parent = await_finished(origin, parent_id)
    assert_delivered_once(tasks, parent)
    assert [t["result"]["text"] for t in tasks] == ["WAITING", "FINAL"]


@pytest.mark.parametrize("ends", ["after the restart", "while the destination is down"])
def test_destination_killed_while_command_runs_is_adopted(
    up: dict[str, Server], tmp_path: Path, ends: str
) -> None:
    origin, peer = up["origin"], up["peer"]
    gate = tmp_path / "gate"
    parent_id = new_thread(origin, parent_of(_child(_gated(gate)), "peer"))
    child_id, view = remote_child_started(origin, peer, parent_id, first_run_done_with_command)
    item_id = _command(view)["id"]

    peer.kill()
    if ends == "while the destination is down":
        gate.touch()
        # tether is down, so nothing announces it: poll for the wrapper's exit record
        poll(lambda: recorded_exit(peer, item_id) is not None, 20, "the wrapper's exit status")
    peer.start()
    if ends == "after the restart":
        assert _command(thread(peer, child_id))["status"] == "running"  # adopted, not lost
        gate.touch()

    tasks, parent = await_finished(origin, parent_id)
    assert_delivered_once(tasks, parent)
    assert [t["result"]["text"] for t in tasks] == ["WAITING", "FINAL"]
    child = thread(peer, child_id)
    assert [r["trigger"]["kind"] for r in child["runs"]] == ["task", "background_command"]
    command = _command(child)
    assert command["status"] == "ended"
    assert command["exitCode"] == 0


def test_destination_killed_and_command_gone_gives_a_restart_run(up: dict[str, Server]) -> None:
    origin, peer = up["origin"], up["peer"]
    parent_id = new_thread(origin, parent_of(_child("sleep 60; echo OK", on_restart=True), "peer"))
    child_id, view = remote_child_started(origin, peer, parent_id, first_run_done_with_command)
    item_id = _command(view)["id"]
    # the pid is recorded as the wrapper starts; no event says when
    pid = poll(lambda: recorded_pid(peer, item_id), 10, "the pid file")

    peer.kill()
    os.killpg(pid, signal.SIGKILL)
    # the orphaned wrapper is reaped by init, not by us: poll until it is really gone
    poll(lambda: process_gone(pid), 20, f"process {pid} to be reaped")
    peer.start()

    tasks, parent = await_finished(origin, parent_id)
    assert_delivered_once(tasks, parent)
    assert [t["result"]["text"] for t in tasks] == ["WAITING", "FINAL"]
    child = thread(peer, child_id)
    kinds = [r["trigger"]["kind"] for r in child["runs"]]
    assert kinds == ["task", "restart"], child["runs"]
    assert _command(child)["status"] == "failed"
    assert all("NOT THE ANSWER" not in m["text"] for m in wake_messages(parent))


def test_a_delegation_made_while_the_destination_is_down_survives_an_origin_kill(
    up: dict[str, Server], tmp_path: Path
) -> None:
    """The create call is a durable mark on the task: it reaches the destination once it is
    back, even though the origin was SIGKILLed meanwhile — and it is made once."""
    origin, peer = up["origin"], up["peer"]
    peer.kill()
    parent_id = new_thread(origin, parent_of(_child("sleep 0.3; echo OK"), "peer"))

    def recorded() -> list[dict[str, Any]] | None:
        runs, tasks = thread(origin, parent_id)["runs"], tasks_of(origin, parent_id)
        return tasks if tasks and runs[0]["status"] == "completed" else None

    tasks = await_on(origin, recorded, 30, "the delegation to be recorded")
    assert tasks[0]["status"] == "queued"
    assert not tasks[0]["childThreadId"]

    origin.kill()
    start_all([peer, origin])
    tasks, parent = await_finished(origin, parent_id)
    assert_delivered_once(tasks, parent)
    assert [t["result"]["text"] for t in tasks] == ["WAITING", "FINAL"]
    with peer.client() as client:
        threads = client.get("/api/threads").json()["threads"]
    children = [t for t in threads if t["parentThreadId"] == parent_id]
    assert [c["threadId"] for c in children] == [tasks[0]["childThreadId"]]


# ---------------------------------------------------------------------- a zombie that lingers

_LAUNCHER = """
import ctypes, signal, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL)
with open(sys.argv[1], "w") as handle:
    handle.write(str(child.pid))
while True:
    signal.pause()  # adopt the server's orphans and never reap them
"""


class UnreapedServer(Server):
    """A server whose orphans (background processes outliving a SIGKILL of it) are adopted
    by a parent that does not reap them — as under a container's PID 1 that is a shell, or
    any init slower than tether's restart."""

    def __init__(self, data: Path, name: str) -> None:
        super().__init__(data, name)
        self.launchers: list[subprocess.Popen[bytes]] = []
        self.server_pid: int | None = None

    def start(self, timeout: float = 30.0) -> UnreapedServer:
        self.data.mkdir(parents=True, exist_ok=True)
        pid_file = self.data.parent / f"{self.name}.server.pid"
        pid_file.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            launcher = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(pid_file), sys.executable, "-m", "tether", "serve",
                 "--data", str(self.data), "--port", str(self.port), "--name", self.name],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.launchers.append(launcher)
        self.server_pid = int(poll(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout,
                                   "the launcher to start the server"))
        deadline = time.monotonic() + timeout
        while not _healthy(self.url):
            assert _state(self.server_pid) not in ("Z", None), f"{self.name} exited: see {self.log}"
            assert time.monotonic() < deadline, f"{self.name} did not answer: see {self.log}"
            time.sleep(0.05)  # the process is still starting: nothing to await yet
        return self

    def kill(self) -> None:
        if self.server_pid is not None:
            os.kill(self.server_pid, signal.SIGKILL)
            poll(lambda: _state(self.server_pid) in ("Z", None), 10, "the server to die")
            self.server_pid = None

    def close(self) -> None:
        self.kill()
        for launcher in self.launchers:
            launcher.kill()
            launcher.wait()


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/api/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def _state(pid: int) -> str | None:
    """The process state letter (``Z`` for a zombie), None once it is reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.fixture
def unreaped(tmp_path: Path) -> Iterator[UnreapedServer]:
    server = UnreapedServer(tmp_path / "zpeer", "zpeer")
    try:
        yield server.start()
    finally:
        server.close()
        for pid in leftover_wrappers(server.data):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def test_destination_restart_does_not_adopt_a_zombie(up: dict[str, Server], unreaped: UnreapedServer) -> None:
    """A killed command whose process is a zombie nobody reaped yet is gone, not alive: it
    is reported by a ``restart`` run, not adopted and ended with no exit code (G6)."""
    origin = up["origin"]
    link(origin, unreaped)
    parent_id = new_thread(origin, parent_of(_child("sleep 60; echo OK", on_restart=True), "zpeer"))
    child_id, view = remote_child_started(origin, unreaped, parent_id, first_run_done_with_command)
    item_id = _command(view)["id"]
    pid = poll(lambda: recorded_pid(unreaped, item_id), 10, "the pid file")

    unreaped.kill()
    os.killpg(pid, signal.SIGKILL)
    poll(lambda: _state(pid) == "Z", 10, f"process {pid} to be a zombie")  # precondition
    unreaped.start()

    await_on(unreaped, lambda: len(thread(unreaped, child_id)["runs"]) >= 2
             and thread(unreaped, child_id)["settled"], 30, "the child's second run")
    tasks, parent = await_delivered(origin, parent_id, 2)
    child = thread(unreaped, child_id)
    assert [r["trigger"]["kind"] for r in child["runs"]] == ["task", "restart"], child["runs"]
    assert _command(child)["status"] == "failed"
    assert_delivered_once(tasks, parent)
