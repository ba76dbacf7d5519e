"""Fresh PostgreSQL databases for tests: one migrated template per session, a copy per test.

Cross-process behaviour needs real commits, so a test never runs inside a rolled-back
transaction: each gets a database of its own (``CREATE DATABASE … TEMPLATE``, as
procrastinate's tests do), dropped after it. The server is named by an admin URL (a role that
may create databases), ``EPISODIC_TEST_DATABASE_URL`` in the plugin and in episodic's own
suite.
"""

from __future__ import annotations

import os
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from episodic.storage.engine import make_engine
from episodic.storage.schema import upgrade

SERVER_VARIABLE = "EPISODIC_TEST_DATABASE_URL"


def admin_url(raw: str) -> str:
    """`raw` with the driver episodic uses (``postgresql+psycopg``); the password kept."""
    url = make_url(raw)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def unreachable(url: str) -> str | None:
    """None if the server at `url` answers within 3 s, else why not (no credential in it)."""
    try:
        engine = create_engine(admin_url(url), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL not reachable at {SERVER_VARIABLE}: {type(exc).__name__}"
    return None


def under_ci() -> bool:
    """``CI=true`` (or 1, yes): a test that needs PostgreSQL fails rather than skips."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class PostgresDatabases:
    """Databases on the server at `url` (an admin URL): `fresh` copies the migrated template
    made at construction; `close` drops the template. Names are ``{prefix}_t_<hex>``."""

    def __init__(self, url: str, prefix: str = "episodic") -> None:
        self._url = admin_url(url)
        self.prefix = prefix
        self.admin = create_engine(self._url, isolation_level="AUTOCOMMIT")
        self.template = f"{prefix}_tmpl_{uuid.uuid4().hex[:10]}"
        self._create(self.template, None)
        engine = make_engine(self.url(self.template))
        upgrade(engine)
        engine.dispose()

    def url(self, name: str) -> str:
        """The URL of database `name` on this server."""
        return make_url(self._url).set(database=name).render_as_string(hide_password=False)

    def fresh(self, *, migrated: bool = True) -> str:
        """A new database (a copy of the migrated template, or empty); returns its name."""
        name = f"{self.prefix}_t_{uuid.uuid4().hex[:12]}"
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
