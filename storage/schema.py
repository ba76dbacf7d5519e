"""Schema version checks and Alembic upgrades.

Alembic is imported only when an upgrade is needed: the common path (schema already at head)
costs one small query, which keeps `episodic episodes list` fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock
from sqlalchemy import Engine, inspect, text

from episodic.core.errors import SchemaNotCurrent
from episodic.storage.engine import sqlite_path
from episodic.storage.tx import advisory_xact_lock, retry_outage

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# Kept in step with the newest file in migrations/versions (a test checks it).
HEAD_REVISION = "0017"


@retry_outage  # a process started while the server restarts waits for it
def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade to ``revision``, serialized across processes (filelock / advisory lock)."""
    from alembic import command

    config = alembic_config()
    if engine.dialect.name == "sqlite":
        lock = FileLock(f"{sqlite_path(engine.url)}.migrate.lock")
        with (
            lock,
            engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn,
            conn.begin(),
        ):
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
        return
    with engine.connect() as conn, conn.begin():
        advisory_xact_lock(conn, "schema")
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def ensure_schema(engine: Engine, *, auto_upgrade: bool) -> None:
    """Make sure the schema is at head: upgrade it (embedded default) or say how to."""
    revision = current_revision(engine)
    if revision == HEAD_REVISION:
        return
    if auto_upgrade:
        upgrade(engine)
        return
    found = "no schema" if revision is None else f"schema revision {revision}"
    raise SchemaNotCurrent(
        f"database has {found}, this version needs {HEAD_REVISION}: run `episodic db upgrade`"
    )
