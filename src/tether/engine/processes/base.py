"""Background commands and monitors as real processes that can outlive tether (SPEC §13, G6).

Each command runs under a small wrapper, in its own process group, that writes the
command's output to ``DATA/proc/ITEM.out`` and, when the command ends, its exit status;
``ITEM.pid`` holds the wrapper's pid, written as soon as it started (``CommandFiles``).
Because those are files, tether learns how a command ended even if it ended while tether
was down: on start it adopts live processes (checking when the pid started, so a reused
pid is never mistaken for ours) and reads the exit status of the ones that finished
(``read_status``).

What differs per platform — how the wrapper is started, how a pid's start is told apart,
how an exit is noticed, how a tree is killed, which shell runs a command — is a
``ProcessBackend``. What does not — the files, tailing, timeouts, adoption and the rule
that only a process's real end ends its item — is ``ProcessManager``, shared by all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from tether.domain.records import Item
from tether.domain.types import ItemKind
from tether.ids import parse_time

log = logging.getLogger(__name__)

_TAIL_INTERVAL = 0.05
_TAIL_BYTES = 4000
#: After a watcher fails, the process is looked at again after this long (doubling).
_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0
#: Popen options of a wrapper: nothing inherited on stdio.
DEVNULL: dict[str, Any] = {
    "stdin": subprocess.DEVNULL,
    "stdout": subprocess.DEVNULL,
    "stderr": subprocess.DEVNULL,
}


class CommandFiles(NamedTuple):
    """Where a command's wrapper writes: its output, its pid file (the wrapper's pid, and on
    Linux the exit status) and the portable wrapper's exit file."""

    out: Path
    pid: Path
    exit: Path


def command_files(root: Path, item_id: str) -> CommandFiles:
    """The files of an item's command: ``ITEM.out``, ``ITEM.pid`` and ``ITEM.exit`` in
    ``root`` — or ``out``, ``pid`` and ``exit`` in the directory ``ITEM``, where an older
    tether put them (a command it started is still adopted and read). No directory per
    command: making one cost as much as making a file (0.1 to 0.4 ms of CPU here)."""
    own = root / item_id
    if own.is_dir():
        return CommandFiles(own / "out", own / "pid", own / "exit")
    return CommandFiles(root / f"{item_id}.out", root / f"{item_id}.pid", root / f"{item_id}.exit")


def read_status(files: CommandFiles) -> tuple[int | None, int | None]:
    """The wrapper's pid and the command's exit status, as far as its files say.

    The pid file holds a line with the pid (tether's, right after the spawn) and — from a
    wrapper that records the status there (Linux) — a line ``exit N`` once the command
    ended: two appends, in either order (a short command may end first), and no file of
    its own for the status (creating a file was the dearest step of a short command on a
    slow file system). A portable wrapper, or a wrapper of an older tether, writes the
    status to the exit file instead. A line cut short by a crash reads as missing."""
    pid = code = None
    with contextlib.suppress(OSError):
        for line in files.pid.read_text().splitlines():
            kind, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                if kind == "exit":
                    code = int(value)
                elif not kind and pid is None:
                    pid = int(value)
    if code is None:
        with contextlib.suppress(OSError, ValueError):
            code = int(files.exit.read_text().strip())
    return pid, code


class ProcessBackend(ABC):
    """The platform's part of running background processes.

    The defaults are POSIX (a new session per command, ``/bin/sh -c``, ``waitpid``); a
    backend for another platform overrides them.
    """

    #: What ``GET /api/health`` reports: "linux", "macos", "windows" or "portable".
    name: str

    @abstractmethod
    def spawn(self, files: CommandFiles, command: str, cwd: Path) -> int:
        """Start ``command`` under a wrapper that writes its output and, at its end, the
        exit status (see ``read_status``) to ``files``, and that outlives tether. Returns
        the wrapper's pid (which the manager records in the pid file)."""

    @abstractmethod
    def identity(self, pid: int) -> str | None:
        """When ``pid`` started, as a stamp that tells it from a later process reusing the
        pid; None if it is gone or a zombie (dead, only not yet reaped)."""

    @abstractmethod
    async def wait_exit(self, pid: int, stamp: str | None) -> None:
        """Return when the process ``pid`` (started at ``stamp``) has ended."""

    @abstractmethod
    def kill_tree(self, pid: int) -> None:
        """Kill ``pid`` and every process it started. A gone process is not an error."""

    def same_start(self, found: str, recorded: str) -> bool:
        """Whether two stamps of ``identity`` are one process's."""
        return found == recorded

    def running(self, pid: int, stamp: str | None) -> bool:
        """``pid`` runs and is the process that started at ``stamp`` (if known)."""
        found = self.identity(pid)
        return found is not None and (stamp is None or self.same_start(found, stamp))

    def reap(self, pid: int) -> None:
        """Collect an ended child of ours, so it does not linger as a zombie."""
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    def group_options(self) -> dict[str, Any]:
        """Options for starting a child in its own process group, so ``kill_tree`` reaches
        everything it starts and a signal to tether does not reach it."""
        return {"start_new_session": True}

    async def open_shell(self, command: str, cwd: str) -> asyncio.subprocess.Process:
        """Start ``command`` in the platform's shell, output (stdout and stderr) piped."""
        return await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            **self.group_options(),
        )

    async def run_shell(self, command: str, cwd: str, timeout_ms: int) -> tuple[str, int | None]:
        """Run a foreground command to its end: ``(output, exit code)``. On timeout its
        tree is killed and the exit code is None (the output is what it wrote so far)."""
        process = await self.open_shell(command, cwd)
        stdout = process.stdout
        assert stdout is not None  # open_shell pipes it
        chunks: list[bytes] = []

        async def read_to_end() -> None:
            while chunk := await stdout.read(1 << 16):
                chunks.append(chunk)
            await process.wait()

        code: int | None = None
        try:
            try:
                await asyncio.wait_for(read_to_end(), timeout_ms / 1000)
                code = process.returncode
            except TimeoutError:
                self.kill_tree(process.pid)
                await read_to_end()
        finally:
            if process.returncode is None:  # cancelled: the command must not outlive its run
                self.kill_tree(process.pid)
                await process.wait()
        return b"".join(chunks).decode("utf-8", "replace"), code


@dataclass
class _Watch:
    """What one watcher knows; kept across its retries so no line is read twice."""

    item: Item
    pid: int
    stamp: str | None
    offset: int
    deadline: float | None
    ended: bool = False


class ProcessManager:
    """Starts, watches, adopts and kills the background processes of one environment."""

    def __init__(
        self,
        root: Path,
        workspace: Path,
        on_lines: Callable[[str, list[str], int], None],
        on_exit: Callable[[str, int | None, list[str], int, str | None, str], None],
        backend: ProcessBackend,
    ) -> None:
        self.root = root
        self.workspace = workspace
        self.backend = backend
        self._on_lines = on_lines
        self._on_exit = on_exit
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._killed: dict[str, str] = {}

    def files(self, item_id: str) -> CommandFiles:
        return command_files(self.root, item_id)

    def last_line(self, item_id: str) -> str | None:
        """The last line a command wrote so far (its output file; no event announces it)."""
        try:
            with open(self.files(item_id).out, "rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - 4096))
                lines = handle.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return None
        return lines[-1] if lines else None

    def spawned_before(self, item_id: str) -> bool:
        """The wrapper's pid was written: this item was spawned (maybe just before a crash)."""
        return self.files(item_id).pid.exists()

    def spawn(self, item: Item) -> tuple[int, str | None]:
        """Start the item's command: its pid and start stamp."""
        files = self.files(item.id)
        files.pid.parent.mkdir(parents=True, exist_ok=True)  # once: it exists after the first
        pid = self.backend.spawn(files, item.command or "", self.workspace)
        # Recorded at once: a restart that finds it knows the command was started. One
        # append (the wrapper may have appended its exit status already), neither synced nor
        # renamed into place (each was a disk operation per command on the loop): its only
        # reader is a later start, once this process is gone, and a file left empty by a
        # crash in between — of tether or of the machine, which takes the command too —
        # reads as "lost", which is what happened.
        with open(files.pid, "a") as handle:
            handle.write(f"{pid}\n")
        return pid, self.backend.identity(pid)

    def fate(self, item: Item) -> tuple[str, int | None]:
        """After a restart: ``("alive", pid)``, ``("exited", code)`` or ``("lost", None)``."""
        recorded, code = read_status(self.files(item.id))
        pid = item.pid if item.pid is not None else recorded
        if pid is not None and self.backend.running(pid, item.pid_start):
            return "alive", pid
        if code is not None:
            return "exited", code
        return "lost", None

    def exit_code(self, item_id: str) -> int | None:
        return read_status(self.files(item_id))[1]

    def watch(self, item: Item, pid: int) -> None:
        if item.id not in self._watchers:
            self._watchers[item.id] = asyncio.create_task(self._watch(item, pid), name=f"watch {item.id}")

    async def _watch(self, item: Item, pid: int) -> None:
        """Follow the process to its end, then report that end once.

        A watcher that fails (tailing, the exit event, the report) never ends the item as
        if its process had ended: it logs, waits a little, and looks at the process again;
        only the process's real end — or its real disappearance — is reported.
        """
        loop = asyncio.get_running_loop()
        deadline = None
        if item.timeout_ms:
            # Counted from the item's start, not from this watch: a command adopted after a
            # restart keeps its original timeout (nothing waits forever).
            ran = (datetime.now(UTC) - parse_time(item.started_at)).total_seconds()
            deadline = loop.time() + max(0.0, item.timeout_ms / 1000 - ran)
        watch = _Watch(item, pid, item.pid_start, item.offset, deadline)
        delay = _RETRY_FIRST
        try:
            while True:
                try:
                    if not watch.ended:
                        await self._follow(watch)
                        watch.ended = True
                    self._report(watch)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("watching %s failed; looking at its process again", item.id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        finally:
            self._watchers.pop(item.id, None)

    async def _follow(self, watch: _Watch) -> None:
        """Return when the process has ended, tailing a monitor's output meanwhile."""
        if watch.stamp is None:  # just spawned: its start was not recorded on the item yet
            watch.stamp = self.backend.identity(watch.pid)
        if not self.backend.running(watch.pid, watch.stamp):
            return
        loop = asyncio.get_running_loop()
        monitor = watch.item.kind == ItemKind.MONITOR
        exited = asyncio.ensure_future(self.backend.wait_exit(watch.pid, watch.stamp))
        try:
            while not exited.done():
                wait = _TAIL_INTERVAL if monitor else None
                if watch.deadline is not None:
                    left = max(0.0, watch.deadline - loop.time())
                    wait = left if wait is None else min(wait, left)
                await asyncio.wait({exited}, timeout=wait)
                if monitor:
                    self._tail_lines(watch)
                if watch.deadline is not None and not exited.done() and loop.time() >= watch.deadline:
                    self.kill(watch.item.id, watch.pid, "timeout")
            exited.result()  # a failed exit watch raises here: looked at again, not an end
        finally:
            exited.cancel()

    def _tail_lines(self, watch: _Watch) -> None:
        """Report a running monitor's complete new lines; the offset moves once reported."""
        lines, offset = self._read_lines(watch.item.id, watch.offset, final=False)
        if lines:
            self._on_lines(watch.item.id, lines, offset)
        watch.offset = offset

    def _report(self, watch: _Watch) -> None:
        item = watch.item
        lines, offset = (
            self._read_lines(item.id, watch.offset, final=True)
            if item.kind == ItemKind.MONITOR
            else ([], watch.offset)
        )
        self.backend.reap(watch.pid)
        reason = self._killed.get(item.id)
        self._on_exit(item.id, self.exit_code(item.id), lines, offset, reason, self._tail(item))
        self._killed.pop(item.id, None)

    def _read_lines(self, item_id: str, offset: int, final: bool) -> tuple[list[str], int]:
        try:
            with open(self.files(item_id).out, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except FileNotFoundError:
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
            with open(self.files(item.id).out, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - _TAIL_BYTES))
                return handle.read().decode("utf-8", "replace").rstrip("\n")
        except FileNotFoundError:
            return ""

    def kill(self, item_id: str, pid: int | None, reason: str = "killed") -> None:
        """End the wrapper and everything the command started."""
        if pid is None:
            return
        self._killed.setdefault(item_id, reason)
        self.backend.kill_tree(pid)

    def prune(self, before: float, keep: set[str]) -> int:
        """Remove the files of every command not in ``keep`` (the items still running)
        whose files were all last written before ``before`` (a ``time.time()``): how each
        ended — its status and its output's tail — is in the store, so only a person reads
        them now, and a command's output can be large. Returns how many commands' files
        went. A command an older tether started has a directory: it goes whole."""
        newest: dict[str, float] = {}
        paths: dict[str, list[str]] = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as entries:
            for entry in entries:
                item_id = entry.name.split(".", 1)[0]
                with contextlib.suppress(OSError):
                    written = entry.stat(follow_symlinks=False).st_mtime
                    newest[item_id] = max(newest.get(item_id, written), written)
                    paths.setdefault(item_id, []).append(entry.path)
        gone = [i for i, t in newest.items() if t < before and i not in keep and i not in self._watchers]
        for item_id in gone:
            for path in paths[item_id]:
                with contextlib.suppress(OSError):
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
        return len(gone)

    async def close(self) -> None:
        """Stop watching (the processes live on; a restart adopts them)."""
        for task in list(self._watchers.values()):
            task.cancel()
        for task in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
