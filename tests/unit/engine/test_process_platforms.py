"""The portable backend's Windows and macOS branches, run here on Linux (SPEC §13).

What Linux cannot do (start a process with Windows creation flags, run cmd.exe, icacls)
is captured at the call that would do it; everything else — trees of real processes,
killing them, files — is real. The platform is faked only through the ``platform``
argument the code takes for this purpose.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tether import private
from tether.engine.processes import LinuxBackend, PortableBackend, portable, wrapper
from tether.engine.processes.base import command_files
from tether.probes import shell_commands

TIMEOUT = 20.0


def windows() -> PortableBackend:
    return PortableBackend("windows", platform="win32")


def macos() -> PortableBackend:
    return PortableBackend("macos", platform="darwin")


class Captured:
    """Stands in for a call Linux cannot make; records its arguments."""

    def __init__(self, result: Any = None) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.result = result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.result


def no_killpg(monkeypatch: pytest.MonkeyPatch) -> Captured:
    """Record ``os.killpg`` instead of calling it (Windows has none)."""
    killpg = Captured()
    monkeypatch.setattr(os, "killpg", killpg)
    return killpg


def leader_with_a_child(leave: bool) -> tuple[subprocess.Popen[bytes], int]:
    """A process group: ``sh`` (the leader, our child) and a ``sleep`` it started. ``leave``:
    the leader ends at once, leaving the sleep behind in its group."""
    script = "sleep 600 & echo $!" + ("" if leave else "; wait")
    leader = subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    if leave:
        leader.wait()
    return leader, child


async def ended(backend: PortableBackend | LinuxBackend, pid: int) -> None:
    await asyncio.wait_for(backend.wait_exit(pid, None), TIMEOUT)


# ---------------------------------------------------------------------------- Windows


def test_windows_wrapper_starts_in_a_new_process_group_without_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    popen = Captured(SimpleNamespace(pid=4242))
    monkeypatch.setattr(portable.subprocess, "Popen", popen)
    monkeypatch.setattr(sys, "_base_executable", "C:\\Python312\\python.exe", raising=False)

    files = command_files(tmp_path, "itm_1")
    assert windows().spawn(files, "dir /b", tmp_path) == 4242

    [(args, kwargs)] = popen.calls
    python = "C:\\Python312\\python.exe"
    assert args[0] == [python, "-I", "-S", wrapper.__file__, str(files.out), str(files.exit), "dir /b"]
    assert kwargs["creationflags"] == portable.CREATE_NEW_PROCESS_GROUP | portable.CREATE_NO_WINDOW
    assert "start_new_session" not in kwargs, "POSIX sessions do not exist on Windows"


async def test_windows_foreground_commands_run_in_cmd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_subprocess_shell`` is ``%COMSPEC% /c COMMAND`` on Windows."""
    shell = Captured()

    async def create_subprocess_shell(*args: Any, **kwargs: Any) -> Any:
        return shell(*args, **kwargs)

    monkeypatch.setattr(portable.asyncio, "create_subprocess_shell", create_subprocess_shell)
    await windows().open_shell("dir /b", str(tmp_path))
    [(args, kwargs)] = shell.calls
    assert args == ("dir /b",)
    assert kwargs["creationflags"] == portable.CREATE_NEW_PROCESS_GROUP | portable.CREATE_NO_WINDOW
    assert "start_new_session" not in kwargs


async def test_windows_kills_a_tree_through_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    killpg = no_killpg(monkeypatch)
    leader, child = leader_with_a_child(leave=False)
    windows().kill_tree(leader.pid)
    assert leader.wait(TIMEOUT) == -signal.SIGKILL
    await ended(windows(), child)
    assert killpg.calls == [], "no process groups on Windows"


def test_windows_takes_only_the_exact_start_for_ours() -> None:
    """Windows hands a freed pid out again at once: a process that started half a second
    after ours is another one. (Linux allows a second: NTP can move psutil's boot time.)"""
    assert windows().same_start("1700000000.500", "1700000000.500")
    assert not windows().same_start("1700000000.500", "1700000000.000")
    assert not macos().same_start("1700000000.500", "1700000000.000")
    assert PortableBackend(platform="linux").same_start("1700000000.500", "1700000000.000")
    assert not windows().same_start("1700000000.500", "123456"), "a Linux tick count is not comparable"


def test_windows_reaps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    waitpid = Captured()
    monkeypatch.setattr(os, "waitpid", waitpid)
    windows().reap(os.getpid())
    assert waitpid.calls == []


def test_windows_token_file_is_restricted_before_the_secret_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "admin.token"
    seen: list[str] = []

    def icacls(command: list[str], **kwargs: Any) -> None:
        seen.append(path.read_text())
        assert command[:4] == ["icacls", str(path), "/inheritance:r", "/grant:r"]
        assert command[4].endswith(":F")
        assert kwargs["check"] is True

    monkeypatch.setattr(private.subprocess, "run", icacls)
    private.write_private(path, "tta_secret\n", platform="win32")
    assert seen == [""], "the access list was set while the file was still empty"
    assert path.read_text() == "tta_secret\n"


# ---------------------------------------------------------------------------- macOS


def test_macos_wrapper_gets_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    popen = Captured(SimpleNamespace(pid=4243))
    monkeypatch.setattr(portable.subprocess, "Popen", popen)
    macos().spawn(command_files(tmp_path, "itm_1"), "echo hi", tmp_path)
    [(args, kwargs)] = popen.calls
    assert args[0][0] == sys.executable and kwargs["start_new_session"] is True
    assert "creationflags" not in kwargs


async def test_macos_kill_reaches_what_a_dead_wrapper_left_behind() -> None:
    """The wrapper is gone (no tree left to walk), but its process group is not: killpg
    ends it. (On Windows such an orphan would outlive the kill: the README says so.)"""
    leader, child = leader_with_a_child(leave=True)
    macos().kill_tree(leader.pid)
    await ended(macos(), child)


def test_posix_token_file_is_owner_only_even_if_it_existed(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    path.write_text("old")
    path.chmod(0o644)
    private.write_private(path, "tta_secret\n")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "tta_secret\n"


# ---------------------------------------------------------------------------- the probes


@pytest.mark.parametrize("platform", ["win32", "darwin"])
async def test_probe_commands_run_in_the_platforms_shell(platform: str, tmp_path: Path) -> None:
    """cmd.exe has no ``sleep``: on Windows the probes' commands go through Python, quoted
    for cmd (double quotes outside, single inside — which ``sh`` reads alike, so they run
    here); elsewhere they are SPEC §8's own."""
    sleep_ok, lines = shell_commands(0.03, platform)
    assert ("sleep 0.03;" in sleep_ok) == (platform != "win32")
    backend = LinuxBackend()
    assert await backend.run_shell(sleep_ok, str(tmp_path), 10_000) == ("OK\n", 0)
    assert await backend.run_shell(lines, str(tmp_path), 10_000) == ("line1\nline2\nline3\n", 0)
