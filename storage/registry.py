"""One engine per database URL per process, so tasks and flows share a connection pool."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from episodic.core.home import mark_state_folder
from episodic.core.settings import Settings
from episodic.storage.engine import make_engine, normalize_url, sqlite_path
from episodic.storage.schema import ensure_schema

_engines: dict[tuple[str, bool], Engine] = {}
_guard = threading.Lock()


def open_engine(settings: Settings, *, read_only: bool = False) -> Engine:
    """A new engine for ``settings``, its schema at head.

    The embedded default (SQLite) is migrated automatically; a server database must be
    upgraded explicitly with `episodic db upgrade` (its schema is an operator's decision).
    """
    if not read_only and _in_state_folder(settings):
        mark_state_folder(settings.home_path)  # the project creates it: marked as its own
    engine = make_engine(settings.url, read_only=read_only)
    ensure_schema(engine, auto_upgrade=engine.dialect.name == "sqlite" and not read_only)
    return engine


def _in_state_folder(settings: Settings) -> bool:
    """True when the ledger is a SQLite file inside the state folder (the default)."""
    url = normalize_url(settings.url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False
    return sqlite_path(url).is_relative_to(settings.home_path)


def engine_for(settings: Settings, *, read_only: bool = False) -> Engine:
    """The process's one engine for ``settings`` (and `read_only`), opened on first use."""
    key = (settings.url, read_only)
    with _guard:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = open_engine(settings, read_only=read_only)
        return engine


def dispose_all() -> None:
    with _guard:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
