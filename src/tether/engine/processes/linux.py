"""The Linux backend: a POSIX ``sh`` wrapper, exits seen through a pidfd, /proc start times.

Exits are events (a pidfd turns readable when its process ends): no polling. A pid's
start is field 22 of ``/proc/PID/stat``, in clock ticks since boot, which no clock change
moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

from tether.engine.processes.base import DEVNULL, CommandFiles, ProcessBackend

#: The exit status is appended to the pid file as ``exit N`` (``base.read_status``):
#: no file of its own, for creating one cost a short command more CPU than anything else
#: it did on a slow file system (0.3 to 0.6 ms here), and no temporary file and ``mv``
#: either (an exec of coreutils, once half of its cost). It need not be atomic, since
#: nothing reads it while the wrapper lives: tether reads it once the wrapper has ended
#: (its pidfd, or a restart that finds it gone), and ``echo`` appends it in one ``write``.
#: A wrapper killed before that leaves no status: the item ends ``lost``.
_WRAPPER = 'sh -c "$1" > "$2" 2>&1 < /dev/null; echo "exit $?" >> "$3"'
#: The same for a command of plain words (``plain_words``), run by the wrapper itself: no
#: second ``sh`` to exec, which was half of such a command's CPU (0.7 of 1.4 ms for
#: ``true`` here). The words go into the script as they are — plain words read the same
#: anywhere — and the files stay positional parameters, which no allowed builtin changes.
#: Its ``$0`` is ``sh``, so that "not found" reads as from ``sh -c``.
_WRAPPER_PLAIN = '{words} > "$1" 2>&1 < /dev/null; echo "exit $?" >> "$2"'

#: What a plain word is made of: nothing the shell would quote, expand, split, glob,
#: redirect or separate on (only blanks between words; no newline, ``;``, ``$``, quotes).
_PLAIN = re.compile(r"[ \tA-Za-z0-9_./:,@%+=-]*")
#: First words that keep their own shell, because run in the wrapper they could end it or
#: change what its last step needs before it records the status: special builtins
#: (``exit``, ``exec``, ``trap``, ``set`` ...) and the builtins that reach them or change
#: the shell's directory, limits or parsing (``command exit``, ``source``, ``cd``,
#: ``ulimit -f 0``, ``alias`` ...), of ``dash`` and of ``bash`` as ``sh``; and reserved
#: words, which are syntax, not commands.
_OWN_SHELL = frozenset(
    {
        # special builtins
        ".", ":", "break", "continue", "eval", "exec", "exit", "export", "readonly",
        "return", "set", "shift", "times", "trap", "unset",
        # builtins that could end the wrapper or change its directory, limits or parsing
        "alias", "builtin", "cd", "command", "enable", "logout", "popd", "pushd",
        "shopt", "source", "suspend", "ulimit", "umask", "unalias",
        # reserved words (bash's too)
        "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function",
        "if", "in", "select", "then", "time", "until", "while",
    }
)


def plain_words(command: str) -> list[str] | None:
    """The command's words if it is one simple command of plain words, which ``sh -c``
    would run as exactly those arguments and nothing else: then the wrapper runs them
    itself. None for anything else (which ``sh -c`` runs as before): shell syntax, an
    assignment before the command, a reserved word, or a builtin that could end or
    change the wrapper (``_OWN_SHELL``)."""
    if not _PLAIN.fullmatch(command):
        return None
    words = command.split()
    if not words or "=" in words[0] or words[0] in _OWN_SHELL:
        return None
    return words


def pidfd_works() -> bool:
    """This kernel has pidfd_open (Linux 5.3+)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class LinuxBackend(ProcessBackend):
    name = "linux"

    def spawn(self, files: CommandFiles, command: str, cwd: Path) -> int:
        out, pid = str(files.out.absolute()), str(files.pid.absolute())
        words = plain_words(command)
        if words is None:
            argv = ["/bin/sh", "-c", _WRAPPER, "tether-wrap", command, out, pid]
        else:
            argv = ["/bin/sh", "-c", _WRAPPER_PLAIN.format(words=" ".join(words)), "sh", out, pid]
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            **DEVNULL,
            **self.group_options(),
        )
        return process.pid

    def identity(self, pid: int) -> str | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]

    async def wait_exit(self, pid: int, stamp: str | None) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        if not self.running(pid, stamp):  # the pid was reused before the pidfd was opened
            os.close(fd)
            return
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def kill_tree(self, pid: int) -> None:
        """The wrapper leads its own process group: SIGKILL the group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
