"""Background processes of a test's servers: finding a wrapper, waiting for its end (a
pidfd, no polling), killing what outlives a server, and reaping adopted orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path

from tether.engine.processes.base import CommandFiles, command_files, read_status
from tether.launch import Server


def item_files(server: Server, item_id: str) -> CommandFiles:
    return command_files(server.data / "proc", item_id)


def wrapper_pid(server: Server, item_id: str) -> int:
    """The pid of the wrapper of a background item (its process group leader)."""
    pid = read_status(item_files(server, item_id))[0]
    assert pid is not None, f"no pid recorded for {item_id}"
    return pid


def recorded_pid(server: Server, item_id: str) -> int | None:
    """The wrapper's pid once it is recorded (None before)."""
    return read_status(item_files(server, item_id))[0]


def recorded_exit(server: Server, item_id: str) -> int | None:
    """The exit status the wrapper recorded (None while it runs, or if it recorded none)."""
    return read_status(item_files(server, item_id))[1]


def await_exit(pid: int, timeout: float = 30.0) -> None:
    """Block until process ``pid`` has ended (a pidfd turns readable): no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs after {timeout}s"
    finally:
        os.close(fd)


def is_alive(pid: int) -> bool:
    """Running (not ended and not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def reap(pid: int) -> None:
    """Reap ``pid`` if it is our (adopted) child."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def leftover_wrappers(data: Path) -> Iterator[int]:
    """Pids of background wrappers of the environment at ``data`` that still run."""
    yield from live_wrappers(data / "proc")


def live_wrappers(proc: Path) -> Iterator[int]:
    """Pids of the wrappers whose files are in ``proc`` that still run: each has its output
    file on its command line (a recycled pid does not)."""
    for pid_file in proc.glob("*.pid"):
        files = command_files(proc, pid_file.stem)
        pid = read_status(files)[0]
        with contextlib.suppress(OSError):
            if pid is not None and str(files.out).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                yield pid


_PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on: bool) -> None:
    """Make this process adopt the orphans of its descendants (a killed server's commands),
    so a test can reap them: a process that is gone must really be gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_zombie_children(keep: set[int]) -> None:
    """Reap ended children of ours (adopted orphans), except the pids in ``keep``."""
    me = str(os.getpid())
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            pid = int(stat_file.parent.name)
            if fields[1] == me and fields[0] == "Z" and pid not in keep:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def process_gone(pid: int) -> bool:
    """The process has exited *and* been reaped (a zombie still has a /proc entry)."""
    return not Path(f"/proc/{pid}").exists()
