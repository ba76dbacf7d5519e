"""Storage: SQLAlchemy models, engine setup, migrations, the pipeline lock and repositories."""

from __future__ import annotations

from sqlalchemy import Engine

from core.settings import Settings
from storage.engine import make_engine
from storage.schema import ensure_schema


def open_engine(settings: Settings, *, read_only: bool = False) -> Engine:
    """The engine for ``settings``, its schema at head.

    The embedded default (SQLite) is migrated automatically; a server database must be
    upgraded explicitly with `episodic db upgrade` (its schema is an operator's decision).
    """
    engine = make_engine(settings.url, read_only=read_only)
    ensure_schema(engine, auto_upgrade=engine.dialect.name == "sqlite" and not read_only)
    return engine
