"""The portable wrapper of one background command: ``python wrapper.py OUT EXIT COMMAND``.

Standard library only, and nothing of tether: the portable backend starts it with the
interpreter in isolated mode. It runs COMMAND in the platform's shell (``/bin/sh -c`` on
POSIX, ``%COMSPEC% /c`` — cmd.exe — on Windows) with its output in the file OUT, and
writes the exit status to the file EXIT atomically and durably when the command ends, so
tether learns it even if it was down at that moment. A status is the shell's: a command
killed by signal N is 128 + N, as ``sh`` reports it.
"""

from __future__ import annotations

import os
import subprocess
import sys


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` so a reader sees the whole file or none, even across a crash of the
    writer, and sync it to disk, so that it survives the machine's."""
    partial = path + ".tmp"
    with open(partial, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def main(out_path: str, exit_path: str, command: str) -> int:
    with open(out_path, "wb") as out:
        code = subprocess.call(
            command, shell=True, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    write_atomic(exit_path, str(128 - code if code < 0 else code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
