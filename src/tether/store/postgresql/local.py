"""A throwaway PostgreSQL cluster on loopback, for tests, benchmarks and trying tether on
PostgreSQL without a server of one's own: ``initdb`` into a temporary directory, ``pg_ctl``
on a free port, removed again by :meth:`LocalCluster.stop`.

The binaries are found without configuration (:func:`find_bindir`). PostgreSQL refuses to
run as root, so under root the cluster runs as the ``postgres`` user (Debian's package
creates it). Durability is off (``fsync=off``): this cluster is for throwaway data only.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tether.launch import free_port

#: The superuser ``initdb`` creates; local connections are trusted.
SUPERUSER = "tether"


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``pg_config --bindir``, else ``PATH``, else the
    newest ``/usr/lib/postgresql/*/bin`` (Debian keeps them off ``PATH``). None: not installed."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(found.stdout.strip()))
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).resolve().parent)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2] or 0))
    candidates.extend(Path(p) for p in reversed(versions))
    return next((c for c in candidates if (c / "initdb").exists() and (c / "pg_ctl").exists()), None)


class LocalCluster:
    """One running cluster; :meth:`database` makes a fresh database and returns its URL."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="tether-pg-"))  # not under a 0700 test dir
        self.port = 0
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._count = 0

    def _run(self, *args: str) -> None:
        user = self._user.pw_uid if self._user else None
        group = self._user.pw_gid if self._user else None
        done = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True, text=True, user=user, group=group, check=False, cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> LocalCluster:
        if self._user:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.port = free_port()
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.root / "log"), "-w", "start")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def database(self, prefix: str = "tether") -> str:
        """A new, empty database; its URL."""
        self._count += 1
        name = f"{prefix}_{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once and remove every file of the cluster."""
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
