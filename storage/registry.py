"""One engine per database URL per process, so tasks and flows share a connection pool."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from core.settings import Settings

_engines: dict[tuple[str, bool], Engine] = {}
_guard = threading.Lock()


def engine_for(settings: Settings, *, read_only: bool = False) -> Engine:
    from storage import open_engine

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
