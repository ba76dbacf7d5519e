"""Real test databases: a migrated template per backend per session, a fresh copy per test.

Cross-process behaviour needs real commits, so tests never run inside a rolled-back
transaction: every test gets its own database (SQLite: a copied file; Postgres:
``CREATE DATABASE ... TEMPLATE``), as procrastinate does.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from episodic.storage.engine import make_engine
from episodic.storage.schema import upgrade

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def pg_admin_url() -> str:
    raw = os.environ.get("EPISODIC_TEST_DATABASE_URL", DEFAULT_PG_URL)
    url = make_url(raw)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def require_postgres_or_reason() -> str | None:
    return pg_available()


def pg_available() -> str | None:
    """None if the server answers, else the reason it does not."""
    try:
        engine = create_engine(pg_admin_url(), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL not reachable at EPISODIC_TEST_DATABASE_URL: {type(exc).__name__}"
    return None


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
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (under CI=true Postgres tests must run)")
    pytest.skip(reason)


class PostgresDatabases:
    def __init__(self) -> None:
        self.admin = create_engine(pg_admin_url(), isolation_level="AUTOCOMMIT")
        self.template = f"episodic_tmpl_{uuid.uuid4().hex[:10]}"
        self._create(self.template, None)
        engine = make_engine(self.url(self.template))
        upgrade(engine)
        engine.dispose()

    def url(self, name: str) -> str:
        return make_url(pg_admin_url()).set(database=name).render_as_string(hide_password=False)

    def fresh(self, *, migrated: bool = True) -> str:
        name = f"episodic_t_{uuid.uuid4().hex[:12]}"
        self._create(name, self.template if migrated else None)
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self.drop(self.template)
        self.admin.dispose()

    def _create(self, name: str, template: str | None) -> None:
        clause = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))


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
