"""Schema version checks and Alembic upgrades.

Alembic is imported only when an upgrade is needed: the common path (schema already at head)
costs one small query, which keeps `episodic episodes list` fast.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock
from sqlalchemy import Connection, Engine, inspect, text

from episodic.core.errors import SchemaNotCurrent, StorageError
from episodic.storage.engine import sqlite_path
from episodic.storage.tx import advisory_xact_lock, retry_outage

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# Kept in step with the newest file in migrations/versions (a test checks it).
HEAD_REVISION = "0018"


@retry_outage  # a process started while the server restarts waits for it
def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return _revision_in(conn)


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade to ``revision``, serialized across processes (filelock / advisory lock).

    Returns the revision before and after, both read under that lock: of several processes
    upgrading at once, only the one that migrated sees them differ."""
    from alembic import command

    return _migrate(engine, lambda config: command.upgrade(config, revision))


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade to ``revision`` (the migration tests; no command offers it), as `upgrade`."""
    from alembic import command

    _migrate(engine, lambda config: command.downgrade(config, revision))


def _revision_in(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    found = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return None if found is None else str(found)


def _migrate(engine: Engine, run: Callable[[Config], None]) -> tuple[str | None, str | None]:
    config = alembic_config()
    if engine.dialect.name == "sqlite":
        lock = FileLock(f"{sqlite_path(engine.url)}.migrate.lock")
        with lock, engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn:
            # A migration that adds a CHECK constraint recreates its table (SQLite cannot
            # alter one in place), which foreign keys would refuse while other tables refer
            # to it: SQLite's own procedure turns them off around the transaction (the pragma
            # is a no-op inside one) and checks every reference before the commit.
            raw = conn.connection.dbapi_connection
            assert raw is not None
            raw.execute("PRAGMA foreign_keys=OFF")
            try:
                with conn.begin():
                    before = _revision_in(conn)
                    config.attributes["connection"] = conn
                    run(config)
                    after = _revision_in(conn)
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise StorageError(
                            f"the migration would leave {len(broken)} rows referring to rows "
                            f"that do not exist (first: {tuple(broken[0])}): nothing changed"
                        )
            finally:
                raw.execute("PRAGMA foreign_keys=ON")
        return before, after
    with engine.connect() as conn, conn.begin():
        advisory_xact_lock(conn, "schema")
        before = _revision_in(conn)
        config.attributes["connection"] = conn
        run(config)
        return before, _revision_in(conn)


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
