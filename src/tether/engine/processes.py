"""Background commands and monitors as real processes that can outlive tether.

Each runs in its own session (so its own process group) under a tiny ``sh`` wrapper that
writes the command's output to ``out``, its own pid to ``pid`` and, when the command
ends, its exit status to ``exit``. Because those are files, tether learns how a command
ended even if it ended while tether was down (G6): on start it adopts live processes
(checking the start time, so a recycled pid is never mistaken for ours) and reads the
exit files of the ones that finished.

Exits are observed through a pidfd (readable when the process ends) — no polling.
Monitor output is tailed from its file every 50 ms while it runs; lines arriving within
one tick are merged into one event, as Claude Code's Monitor tool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from tether.domain.records import Item
from tether.domain.types import ItemKind
from tether.ids import parse_time

log = logging.getLogger(__name__)

_WRAPPER = (
    'echo $$ > "$2/pid"; sh -c "$1" > "$2/out" 2>&1 < /dev/null; '
    'echo $? > "$2/exit.tmp"; mv "$2/exit.tmp" "$2/exit"'
)
_TAIL_INTERVAL = 0.05
_TAIL_BYTES = 4000


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None if it is
    gone or a zombie (dead, only not yet reaped: it will never write its exit file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


class ProcessManager:
    def __init__(
        self,
        root: Path,
        workspace: Path,
        on_lines: Callable[[str, list[str], int], None],
        on_exit: Callable[[str, int | None, list[str], int, str | None, str], None],
    ) -> None:
        self.root = root
        self.workspace = workspace
        self._on_lines = on_lines
        self._on_exit = on_exit
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._killed: dict[str, str] = {}

    def dir(self, item_id: str) -> Path:
        return self.root / item_id

    def spawned_before(self, item_id: str) -> bool:
        """The wrapper wrote its pid: this item was spawned (maybe just before a crash)."""
        return (self.dir(item_id) / "pid").exists()

    def spawn(self, item: Item) -> tuple[int, str | None]:
        directory = self.dir(item.id)
        directory.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", _WRAPPER, "tether-wrap", item.command or "", str(directory)],
            cwd=self.workspace,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return proc.pid, process_start_time(proc.pid)

    def fate(self, item: Item) -> tuple[str, int | None]:
        """After a restart: ``("alive", pid)``, ``("exited", code)`` or ``("lost", None)``."""
        directory = self.dir(item.id)
        pid = item.pid
        if pid is None:
            with contextlib.suppress(OSError, ValueError):
                pid = int((directory / "pid").read_text())
        if (
            pid is not None
            and process_start_time(pid) is not None
            and (item.pid_start is None or process_start_time(pid) == item.pid_start)
        ):
            return "alive", pid
        code = self.exit_code(item.id)
        if code is not None:
            return "exited", code
        return "lost", None

    def exit_code(self, item_id: str) -> int | None:
        try:
            return int((self.dir(item_id) / "exit").read_text().strip())
        except (OSError, ValueError):
            return None

    def watch(self, item: Item, pid: int) -> None:
        if item.id not in self._watchers:
            self._watchers[item.id] = asyncio.create_task(self._watch(item, pid), name=f"watch {item.id}")

    async def _watch(self, item: Item, pid: int) -> None:
        offset = item.offset
        try:
            exited = self._exit_future(pid)
            deadline = None
            if item.timeout_ms:
                # Counted from the item's start, not from this watch: a command adopted
                # after a restart keeps its original timeout (nothing waits forever).
                ran = (datetime.now(UTC) - parse_time(item.started_at)).total_seconds()
                left = max(0.0, item.timeout_ms / 1000 - ran)
                deadline = asyncio.get_running_loop().time() + left
            while not exited.done():
                wait = _TAIL_INTERVAL if item.kind == ItemKind.MONITOR else None
                if deadline is not None:
                    left = max(0.0, deadline - asyncio.get_running_loop().time())
                    wait = left if wait is None else min(wait, left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exited), wait)
                if item.kind == ItemKind.MONITOR:
                    lines, offset = self._read_lines(item.id, offset, final=False)
                    if lines:
                        self._on_lines(item.id, lines, offset)
                if (
                    deadline is not None
                    and not exited.done()
                    and asyncio.get_running_loop().time() >= deadline
                ):
                    self.kill(item.id, pid, "timeout")
            lines, offset = (
                self._read_lines(item.id, offset, final=True)
                if item.kind == ItemKind.MONITOR
                else ([], offset)
            )
            self._reap(pid)
            reason = self._killed.pop(item.id, None)
            self._on_exit(item.id, self.exit_code(item.id), lines, offset, reason, self._tail(item))
        except asyncio.CancelledError:
            raise
        except Exception:  # a watcher must never die silently: log it, report the item lost
            log.exception("watching %s failed", item.id)
            self._on_exit(item.id, None, [], offset, "watcher failed", "")
        finally:
            self._watchers.pop(item.id, None)

    def _exit_future(self, pid: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            future.set_result(None)
            return future

        def ready() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            if not future.done():
                future.set_result(None)

        loop.add_reader(fd, ready)
        return future

    @staticmethod
    def _reap(pid: int) -> None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    def _read_lines(self, item_id: str, offset: int, final: bool) -> tuple[list[str], int]:
        try:
            with open(self.dir(item_id) / "out", "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            return [], offset
        if not final:
            cut = data.rfind(b"\n")
            data = data[: cut + 1] if cut >= 0 else b""
        text = data.decode("utf-8", "replace")
        lines = [line for line in text.splitlines() if line.strip()]
        return lines, offset + len(data)

    def _tail(self, item: Item) -> str:
        if item.kind != ItemKind.COMMAND:
            return ""
        try:
            with open(self.dir(item.id) / "out", "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - _TAIL_BYTES))
                return handle.read().decode("utf-8", "replace").rstrip("\n")
        except OSError:
            return ""

    def kill(self, item_id: str, pid: int | None, reason: str = "killed") -> None:
        """End the whole process group (the wrapper and everything the command started)."""
        if pid is None:
            return
        self._killed.setdefault(item_id, reason)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    async def close(self) -> None:
        """Stop watching (the processes live on; a restart adopts them)."""
        for task in list(self._watchers.values()):
            task.cancel()
        for task in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
