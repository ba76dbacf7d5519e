"""A private PostgreSQL cluster the fault suite may stop, crash and start at will.

The shared server the tests use must never be restarted under them, so the restart test and
the fault suite's `pg-restart` scenario make their own cluster with the machine's `initdb`, in
a temporary folder, on a free loopback port, trust auth, removed at the end. Run as root, the
cluster belongs to the `postgres` system user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"{name} not found: the pg-restart scenario needs PostgreSQL's binaries")
    return found


def cluster_unavailable() -> str | None:
    """None if a private cluster can be made here, else why not."""
    try:
        _binary("initdb")
        _binary("pg_ctl")
    except RuntimeError as exc:
        return str(exc)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """``with PrivateCluster() as cluster: cluster.url("db")``; `restart(mode, down_s)` stops
    the server (``fast``: a clean shutdown that ends every session; ``immediate``: a crash, WAL
    recovery on start), waits `down_s` seconds with nothing listening, and starts it again.

    Raises RuntimeError (with the server's log tail) when the cluster cannot be made or started.
    """

    def __init__(self) -> None:
        # Not under a caller's private temporary folder (mode 700): the server's own user
        # must reach its data directory.
        shared = os.environ.get("TMPDIR") or "/tmp"
        self.root = Path(tempfile.mkdtemp(prefix="episodic-pgcluster-", dir=shared))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            tail = self.log.read_text()[-1500:] if self.log.exists() else ""
            raise RuntimeError(
                f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} failed: "
                f"{(done.stderr or done.stdout).strip()[-500:]} {tail}"
            )

    def __enter__(self) -> PrivateCluster:
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            _binary("initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-instructions",
            "-E",
            "UTF8",
        )
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c max_connections=100 -c shared_buffers=32MB"
        )
        self._run(
            _binary("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str) -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str, down_s: float) -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, migrated database; returns its URL."""
        from episodic.storage.schema import upgrade

        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        engine = create_engine(self.url(name))
        upgrade(engine)
        engine.dispose()
        return self.url(name)
