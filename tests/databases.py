"""Real test databases: a migrated template per backend per session, a fresh copy per test.

Cross-process behaviour needs real commits, so tests never run inside a rolled-back
transaction: every test gets its own database (SQLite: a copied file; Postgres:
``CREATE DATABASE ... TEMPLATE``, the plugin's own `episodic.testing.postgres`, which teams
use too), as procrastinate does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from episodic.storage.engine import make_engine
from episodic.storage.schema import upgrade
from episodic.testing import postgres as testing_postgres
from episodic.testing.postgres import SERVER_VARIABLE, admin_url, under_ci, unreachable

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def pg_admin_url() -> str:
    return admin_url(os.environ.get(SERVER_VARIABLE, DEFAULT_PG_URL))


def require_postgres_or_reason() -> str | None:
    return pg_available()


def pg_available() -> str | None:
    """None if the server answers, else the reason it does not."""
    return unreachable(pg_admin_url())


def terminate_other_sessions(engine: Engine) -> int:
    """``pg_terminate_backend`` of every other session of `engine`'s database (what a server
    restart or a failover does to a pool); returns how many were ended."""
    admin = create_engine(engine.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d "
                "AND pid <> pg_backend_pid()"
            ),
            {"d": engine.url.database},
        ).all()
    admin.dispose()
    return len(killed)


def require_postgres() -> None:
    reason = pg_available()
    if reason is None:
        return
    if under_ci():
        pytest.fail(f"{reason} (under CI=true Postgres tests must run)")
    pytest.skip(reason)


class PostgresDatabases(testing_postgres.PostgresDatabases):
    """The plugin's databases (`episodic.testing.postgres`) on this suite's server."""

    def __init__(self) -> None:
        super().__init__(pg_admin_url())


class SqliteDatabases:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.template = root / "template.db"
        engine = make_engine(f"sqlite:///{self.template}")
        upgrade(engine)
        engine.dispose()

    def fresh(self, folder: Path, *, migrated: bool = True) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "episodic.db"
        if migrated:
            shutil.copyfile(self.template, target)
        return f"sqlite:///{target}"
