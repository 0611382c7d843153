"""The portable backend: the Python standard library and ``psutil``, on any platform.

The wrapper is a small Python script (``wrapper.py``) run by the interpreter itself, not
``sh``. A pid's start is ``psutil``'s create time; an exit is noticed by polling (no event
source is portable); a tree is killed with ``psutil`` (and, on POSIX, its process group).

Its platform branches:

- **POSIX** (macOS, Linux when forced, the BSDs): each command in its own session, so
  ``killpg`` also reaches what a command left behind after its wrapper died.
- **Windows**: no sessions, process groups or SIGKILL. The wrapper starts with
  ``CREATE_NEW_PROCESS_GROUP`` (a Ctrl-C to tether does not reach it) and no console
  window; a tree is killed through ``psutil`` (TerminateProcess on each process); commands
  run in ``cmd.exe`` (``%COMSPEC% /c``), foreground ones too; nothing is reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from tether.engine.processes import wrapper
from tether.engine.processes.base import DEVNULL, CommandFiles, ProcessBackend

#: How often an exit is looked for where no event source exists.
POLL_INTERVAL = 0.1
#: Two create times within this many seconds are one process's. On Linux psutil adds the
#: boot time, read from the wall clock, to a process's start, so one process can read a
#: second apart across an NTP step (and Linux hands out pids in order: none comes round
#: again within a second). macOS and Windows record the start itself; Windows reuses pids
#: at once, so there only an exact match (to the millisecond) is ours.
_LINUX_SAME_START_S, _SAME_START_S = 1.0, 0.001
# Windows creation flags (named here: the subprocess constants exist only on Windows).
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_NO_WINDOW = 0x08000000


class PortableBackend(ProcessBackend):
    def __init__(self, name: str = "portable", platform: str = sys.platform) -> None:
        self.name = name
        self.windows = platform == "win32"
        self._same_start_s = _LINUX_SAME_START_S if platform.startswith("linux") else _SAME_START_S

    def _interpreter(self) -> str:
        """On Windows a venv's python.exe is a launcher that starts the real interpreter as
        its child, so the pid we see would not be the wrapper's: use the base interpreter
        (the wrapper needs only the standard library)."""
        if self.windows:
            return getattr(sys, "_base_executable", sys.executable)
        return sys.executable

    def spawn(self, files: CommandFiles, command: str, cwd: Path) -> int:
        process = subprocess.Popen(
            [self._interpreter(), "-I", "-S", wrapper.__file__, str(files.out), str(files.exit), command],
            cwd=cwd,
            **DEVNULL,
            **self.group_options(),
        )
        return process.pid

    def identity(self, pid: int) -> str | None:
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return f"{process.create_time():.3f}"
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone, or not ours to see
            return None

    def same_start(self, found: str, recorded: str) -> bool:
        """A stamp another backend recorded (e.g. Linux clock ticks) is not comparable and
        so never ours: a process is never adopted on a guess."""
        try:
            return abs(float(found) - float(recorded)) < self._same_start_s
        except ValueError:
            return False

    async def wait_exit(self, pid: int, stamp: str | None) -> None:
        while self.running(pid, stamp):
            await asyncio.sleep(POLL_INTERVAL)

    def kill_tree(self, pid: int) -> None:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        if not self.windows:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                process.kill()

    def reap(self, pid: int) -> None:
        if not self.windows:  # Windows keeps no zombies
            super().reap(pid)

    def group_options(self) -> dict[str, Any]:
        if self.windows:
            return {"creationflags": CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW}
        return super().group_options()

    async def open_shell(self, command: str, cwd: str) -> asyncio.subprocess.Process:
        if not self.windows:
            return await super().open_shell(command, cwd)
        return await asyncio.create_subprocess_shell(  # %COMSPEC% /c COMMAND: cmd.exe
            command,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            **self.group_options(),
        )
