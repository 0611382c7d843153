"""The process backends (SPEC §13) with real processes, and the rule that a failing watcher
never ends an item as if its process had ended (issue #9): the process is looked at
again, and only its real end — or its real disappearance — is reported, once.

Commands are steered with a flag file: a command waits until the test creates it, so the
test decides when a process ends; nothing here sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit import live_wrappers
from tether.domain.records import Item
from tether.domain.types import ItemKind
from tether.engine.processes import ProcessBackend, ProcessManager, choose_backend
from tether.engine.processes.base import command_files, read_status
from tether.engine.processes.linux import plain_words
from tether.ids import now

TIMEOUT = 20.0


@dataclass
class Reports:
    """What the manager reported, with an event per kind of report."""

    lines: list[str] = field(default_factory=list)
    ends: list[tuple[int | None, list[str], str | None]] = field(default_factory=list)
    got_lines: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def on_lines(self, item_id: str, lines: list[str], offset: int) -> None:
        self.lines += lines
        self.got_lines.set()

    def on_exit(
        self, item_id: str, code: int | None, lines: list[str], offset: int, reason: str | None, tail: str
    ) -> None:
        self.ends.append((code, lines, reason))
        self.ended.set()


@pytest.fixture(params=["linux", "portable"])
def backend(request: pytest.FixtureRequest) -> ProcessBackend:
    return choose_backend(request.param)


@pytest.fixture
async def manager(tmp_path: Path, backend: ProcessBackend) -> AsyncIterator[tuple[ProcessManager, Reports]]:
    reports = Reports()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    found = ProcessManager(tmp_path / "proc", workspace, reports.on_lines, reports.on_exit, backend)
    yield found, reports
    await found.close()
    for pid in live_wrappers(tmp_path / "proc"):  # a failed test leaves no command running
        backend.kill_tree(pid)


def item(kind: ItemKind, command: str) -> Item:
    return Item(id="itm_1", thread_id="thr_1", kind=kind, started_at=now(), command=command)


def until(flag: Path, then: str) -> str:
    return f"until [ -e {flag} ]; do sleep 0.01; done; {then}"


class Injected:
    """Wraps ``real`` so that its first ``times`` calls raise (an injected watcher failure);
    ``reached(n)`` waits until it has been called ``n`` times."""

    def __init__(self, times: int, real: Callable[..., Any]) -> None:
        self.times, self.real = times, real
        self.calls: list[str] = []
        self._called = asyncio.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("fail" if len(self.calls) < self.times else "real")
        self._called.set()
        if self.calls[-1] == "fail":
            raise OSError("injected watcher failure")
        return self.real(*args, **kwargs)

    async def reached(self, count: int) -> None:
        async with asyncio.timeout(TIMEOUT):
            while len(self.calls) < count:
                self._called.clear()
                await self._called.wait()


async def test_failed_exit_watch_does_not_end_a_running_item(
    manager: tuple[ProcessManager, Reports], backend: ProcessBackend, tmp_path: Path, monkeypatch: Any
) -> None:
    processes, reports = manager
    injected = Injected(3, backend.wait_exit)
    monkeypatch.setattr(backend, "wait_exit", injected)
    flag = tmp_path / "go"
    command = item(ItemKind.COMMAND, until(flag, "echo done; exit 3"))
    pid, stamp = processes.spawn(command)
    processes.watch(command, pid)

    await injected.reached(4)  # three failures, then watching again
    assert reports.ends == [], "a failed exit watch ended the item while its process runs"
    assert backend.running(pid, stamp)

    flag.touch()
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    await processes.close()
    assert reports.ends == [(3, [], None)]
    assert injected.calls == ["fail", "fail", "fail", "real"]


async def test_failed_tailing_does_not_end_a_running_monitor(
    manager: tuple[ProcessManager, Reports], tmp_path: Path, monkeypatch: Any
) -> None:
    processes, reports = manager
    injected = Injected(3, processes._read_lines)
    monkeypatch.setattr(processes, "_read_lines", injected)
    flag = tmp_path / "go"
    monitor = item(ItemKind.MONITOR, "echo one; " + until(flag, "echo two"))
    pid, _ = processes.spawn(monitor)
    processes.watch(monitor, pid)

    await asyncio.wait_for(reports.got_lines.wait(), TIMEOUT)
    assert injected.calls[:3] == ["fail"] * 3 and reports.lines == ["one"]
    assert reports.ends == [], "a failed tail ended the monitor while its process runs"

    flag.touch()
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    await processes.close()
    [(code, last_lines, reason)] = reports.ends  # the real end, once
    assert (code, reason) == (0, None)
    assert reports.lines + last_lines == ["one", "two"], "no line lost or read twice"


async def test_a_process_gone_while_its_watcher_fails_is_reported_once(
    manager: tuple[ProcessManager, Reports], backend: ProcessBackend, monkeypatch: Any
) -> None:
    """Its real disappearance: killed from outside (no exit status) while every exit watch
    fails, it is still found gone, and reported once."""
    processes, reports = manager
    injected = Injected(10**6, backend.wait_exit)
    monkeypatch.setattr(backend, "wait_exit", injected)
    command = item(ItemKind.COMMAND, "sleep 600")
    pid, _ = processes.spawn(command)
    processes.watch(command, pid)
    await injected.reached(2)
    assert reports.ends == []

    backend.kill_tree(pid)
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    await processes.close()
    assert reports.ends == [(None, [], None)]


async def test_a_failing_report_is_retried_not_dropped(
    manager: tuple[ProcessManager, Reports], monkeypatch: Any
) -> None:
    """The report itself failing (the store busy, say) is retried until it goes through."""
    processes, reports = manager
    injected = Injected(2, reports.on_exit)
    monkeypatch.setattr(processes, "_on_exit", injected)
    command = item(ItemKind.COMMAND, "exit 5")
    pid, _ = processes.spawn(command)
    processes.watch(command, pid)
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    assert injected.calls == ["fail", "fail", "real"] and reports.ends == [(5, [], None)]


async def test_timeout_kills_and_says_so(manager: tuple[ProcessManager, Reports]) -> None:
    processes, reports = manager
    command = item(ItemKind.COMMAND, "sleep 600")
    command.timeout_ms = 200
    pid, _ = processes.spawn(command)
    processes.watch(command, pid)
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    assert reports.ends == [(None, [], "timeout")]


async def test_exit_status_is_recorded_durably(manager: tuple[ProcessManager, Reports]) -> None:
    """In the item's files, also for a signal's end, and nothing beside them; the wrapper's
    pid is recorded as soon as it started."""
    processes, reports = manager
    command = item(ItemKind.COMMAND, "sleep 0.2; kill -9 $$")
    pid, _ = processes.spawn(command)
    assert read_status(processes.files(command.id)) == (pid, None)
    processes.watch(command, pid)
    await asyncio.wait_for(reports.ended.wait(), TIMEOUT)
    assert reports.ends == [(137, [], None)]
    assert read_status(processes.files(command.id)) == (pid, 137)
    assert {path.name for path in processes.root.iterdir()} <= {"itm_1.pid", "itm_1.out", "itm_1.exit"}


async def test_a_command_that_ends_before_its_pid_is_recorded_keeps_both(
    manager: tuple[ProcessManager, Reports],
) -> None:
    """A short command's wrapper may record its status before tether records its pid: the
    two appends, in either order, read back as both."""
    processes, _ = manager
    for n in range(20):
        command = item(ItemKind.COMMAND, "exit 3")
        command.id = f"itm_{n}"
        pid, _ = processes.spawn(command)
        await asyncio.to_thread(_reap, pid)
        assert read_status(processes.files(command.id)) == (pid, 3)
        assert processes.fate(command) == ("exited", 3)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@pytest.mark.parametrize(
    ("pid_file", "exit_file", "expected"),
    [
        ("41\n", None, (41, None)),
        ("41\nexit 0\n", None, (41, 0)),
        ("exit 9\n41\n", None, (41, 9)),  # the wrapper was first
        ("41\nexit", None, (41, None)),  # cut short by a crash
        ("41\n", "2\n", (41, 2)),  # a portable wrapper, or an older tether's
        ("", "", (None, None)),
    ],
)
@pytest.mark.parametrize("older", [False, True], ids=["files", "older-directory"])
def test_read_status_reads_either_order_and_either_file(
    tmp_path: Path, pid_file: str, exit_file: str | None, expected: tuple[int | None, int | None], older: bool
) -> None:
    """Also from the directory per command of an older tether (``ITEM/pid``, ``ITEM/exit``)."""
    if older:
        (tmp_path / "itm_1").mkdir()
    files = command_files(tmp_path, "itm_1")
    assert (files.pid.name == "pid") == older
    files.pid.write_text(pid_file)
    if exit_file is not None:
        files.exit.write_text(exit_file)
    assert read_status(files) == expected


async def test_fate_tells_a_reused_pid_from_ours(
    manager: tuple[ProcessManager, Reports], tmp_path: Path
) -> None:
    """After a restart: alive only if the pid still is the process that started then."""
    processes, _ = manager
    flag = tmp_path / "go"
    command = item(ItemKind.COMMAND, until(flag, "exit 4"))
    command.pid, command.pid_start = processes.spawn(command)
    assert processes.fate(command) == ("alive", command.pid)

    impostor = item(ItemKind.COMMAND, "")
    impostor.pid, impostor.pid_start = command.pid, "12345"  # the same pid, another start
    assert processes.fate(impostor) == ("lost", None)

    flag.touch()
    psutil.Process(command.pid).wait(TIMEOUT)
    assert processes.fate(command) == ("exited", 4)


def test_a_pid_file_emptied_by_a_machine_crash_reads_as_lost(manager: tuple[ProcessManager, Reports]) -> None:
    """The pid file is written whole but not synced: after a crash of the machine it may be
    empty, and the command (gone with the machine) must read as lost, not fail the restart."""
    processes, _ = manager
    command = item(ItemKind.COMMAND, "")
    processes.root.mkdir(parents=True)
    processes.files(command.id).pid.write_text("")
    assert processes.spawned_before(command.id)
    assert processes.fate(command) == ("lost", None)


def test_an_exit_file_left_empty_reads_as_lost(manager: tuple[ProcessManager, Reports]) -> None:
    """The wrapper writes its exit status in place, not renamed into it: killed between
    opening the file and writing it, it leaves an empty one. Its status is then unknown: the
    command reads as lost, never as an exit with some code."""
    processes, _ = manager
    command = item(ItemKind.COMMAND, "")
    processes.root.mkdir(parents=True)
    processes.files(command.id).pid.write_text("999999999\n")  # no such process
    processes.files(command.id).exit.write_text("")
    assert processes.exit_code(command.id) is None
    assert processes.fate(command) == ("lost", None)


def test_a_command_an_older_tether_started_is_still_read(manager: tuple[ProcessManager, Reports]) -> None:
    """An older tether kept a command's files in a directory of its own (``ITEM/pid``,
    ``ITEM/out``): after an upgrade, a command that ended meanwhile still reads as ended
    with its status, and its output is still found."""
    processes, _ = manager
    command = item(ItemKind.COMMAND, "")
    (processes.root / command.id).mkdir(parents=True)
    (processes.root / command.id / "pid").write_text("999999999\nexit 5\n")  # gone, with a status
    (processes.root / command.id / "out").write_text("first\nlast\n")
    assert processes.spawned_before(command.id)
    assert processes.fate(command) == ("exited", 5)
    assert processes.last_line(command.id) == "last"


def test_prune_takes_a_commands_files_together_and_only_when_all_are_old(
    manager: tuple[ProcessManager, Reports],
) -> None:
    """A command's files go together, once the newest of them is older than the cutoff
    (a quiet command's old output beside a fresh exit status stays); one in ``keep`` stays;
    an older tether's directory goes whole."""
    processes, _ = manager
    root = processes.root
    root.mkdir(parents=True)
    hour_ago = time.time() - 3600
    for name in ("bg_old.out", "bg_old.pid", "bg_fresh.out", "bg_fresh.pid", "bg_kept.out", "bg_kept.pid"):
        (root / name).write_text("x")
        os.utime(root / name, (hour_ago, hour_ago))
    os.utime(root / "bg_fresh.pid")  # its exit status was just appended
    (root / "bg_older").mkdir()
    (root / "bg_older" / "out").write_text("x")
    for path in (root / "bg_older" / "out", root / "bg_older"):
        os.utime(path, (hour_ago, hour_ago))
    assert processes.prune(time.time() - 60, keep={"bg_kept"}) == 2
    left = sorted(p.name for p in root.iterdir())
    assert left == ["bg_fresh.out", "bg_fresh.pid", "bg_kept.out", "bg_kept.pid"]
    assert processes.prune(time.time() - 60, keep=set()) == 1  # bg_kept, now ended


def test_a_zombie_is_not_running(backend: ProcessBackend) -> None:
    """Dead but not reaped: it will never write its exit status, so it is not ours to wait on."""
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, still unreaped
    try:
        assert backend.identity(child.pid) is None
    finally:
        child.wait()


async def test_foreground_shell_reports_output_and_timeout(backend: ProcessBackend, tmp_path: Path) -> None:
    assert await backend.run_shell("echo hi; echo err >&2; exit 2", str(tmp_path), 10_000) == ("hi\nerr\n", 2)
    output, code = await backend.run_shell("echo partial; sleep 600", str(tmp_path), 300)
    assert (output, code) == ("partial\n", None)


def test_backend_names_per_platform(monkeypatch: Any) -> None:
    monkeypatch.delenv("TETHER_PROCESSES", raising=False)
    assert choose_backend(platform="linux").name == "linux"
    assert choose_backend(platform="darwin").name == "macos"
    assert choose_backend(platform="win32").name == "windows"
    assert choose_backend(platform="freebsd14").name == "portable"
    monkeypatch.setenv("TETHER_PROCESSES", "portable")
    assert choose_backend(platform="linux").name == "portable"
    with pytest.raises(ValueError, match="needs Linux"):
        choose_backend("linux", platform="darwin")
    with pytest.raises(ValueError, match="expected"):
        choose_backend("kqueue")


# ---------------------------------------------------------------------- plain words (Linux)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("true", ["true"]),
        ("  pytest -q tests/  ", ["pytest", "-q", "tests/"]),
        ("./run.sh --n=2 a,b me@host:1 50% +x", ["./run.sh", "--n=2", "a,b", "me@host:1", "50%", "+x"]),
        ("read line", ["read", "line"]),  # a builtin that changes only a variable
        # everything else keeps ``sh -c``:
        ("", None),
        (" \t", None),
        ("true\nfalse", None),  # two commands
        ("true; false", None),
        ("echo $HOME", None),
        ("ls *.py", None),
        ("echo 'a b'", None),
        ("echo a\\ b", None),
        ("echo hi > out", None),
        ("a | b", None),
        ("sleep 1 &", None),
        ("ls ~", None),
        ("echo # not a comment here", None),
        ("FOO=1 env", None),  # an assignment before the command
        ("exit 3", None),  # would end the wrapper before it records the status
        ("exec sleep 9", None),  # would replace the wrapper
        ("trap true TERM", None),
        ("command exit 3", None),  # a special builtin, reached through another
        ("source ./env", None),
        ("ulimit -f 0", None),  # the wrapper could no longer write the status
        ("umask 777", None),
        ("cd /tmp", None),
        ("function f", None),  # bash's syntax
        ("set -e", None),
        (". ./env", None),
        ("if true", None),  # syntax
        ("echo héllo", None),  # not ASCII: left to the shell
    ],
)
def test_plain_words_are_only_what_sh_would_run_as_those_words(command: str, words: list[str] | None) -> None:
    assert plain_words(command) == words


#: First words whose output is the same every run (``time``'s is not: it reports times).
_FIRST = st.sampled_from(
    ["echo", "printf", "true", "false", "/bin/echo", "ls", "test", "cd", "pwd", "wc", "sh", "no-such-command",
     "exit", "exec", "umask", "command", "type", "read", "getopts", "ulimit", "alias", "in", "for"]
)
_ARG = st.sampled_from(["-n", "a", "b=c", "/nonexistent", "-1", "x,y", "3", "%s", "--", "-c", "-f", "0"])


@settings(max_examples=40, deadline=None)
@given(words=st.lists(_ARG, max_size=3), first=_FIRST, separator=st.sampled_from([" ", "\t", "  "]))
def test_a_plain_command_runs_as_under_sh_c(first: str, words: list[str], separator: str) -> None:
    """Whichever way the wrapper runs a command — itself, for plain words, or through
    ``sh -c`` — its output and exit status are what ``sh -c`` alone gives."""
    _assert_runs_as_under_sh_c(separator.join([first, *words]))


@pytest.mark.parametrize(
    "command",
    ["exit 3", "command exit 4", "exec false", "ulimit -f 0", "umask 777", "cd /", "set -e",
     "trap false EXIT", "shift 5", "alias echo=false", "if", "for x"],
)
def test_a_builtin_that_could_end_the_wrapper_runs_as_under_sh_c(command: str) -> None:
    """The commands that would end the wrapper, or stop it recording the status, if it ran
    them itself: each still ends as under ``sh -c``, its status recorded."""
    _assert_runs_as_under_sh_c(command)


def _assert_runs_as_under_sh_c(command: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root, cwd = Path(scratch) / "proc", Path(scratch) / "work"
        root.mkdir()
        cwd.mkdir()
        files = command_files(root, "itm_1")
        expected = subprocess.run(
            ["sh", "-c", command], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, check=False,
        )
        pid = choose_backend("linux").spawn(files, command, cwd)
        _reap(pid)
        assert files.out.read_bytes() == expected.stdout, command
        assert read_status(files)[1] == expected.returncode, command
