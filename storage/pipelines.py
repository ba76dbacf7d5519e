"""Per-pipeline settings every process shares (today: the timezone that decides weeks)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update

from episodic.storage.base import utcnow
from episodic.storage.locks import keyed_transaction
from episodic.storage.models import PipelineRow
from episodic.storage.tx import retry_outages


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    timezone: str
    created_at: datetime
    updated_at: datetime


_COLUMNS = (PipelineRow.name, PipelineRow.timezone, PipelineRow.created_at, PipelineRow.updated_at)


def _config(row: Any) -> PipelineConfig:
    return PipelineConfig(row[0], row[1], row[2], row[3])


@retry_outages
class PipelineStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, name: str) -> PipelineConfig | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(*_COLUMNS).where(PipelineRow.name == name)).one_or_none()
        return None if row is None else _config(row)

    def list(self) -> list[PipelineConfig]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(*_COLUMNS).order_by(PipelineRow.name)).all()
        return [_config(row) for row in rows]

    def ensure(self, name: str, timezone: str) -> tuple[PipelineConfig, bool]:
        """The pipeline's row, recorded with `timezone` if it has none yet (the first use
        wins: concurrent first uses are serialized). Returns (config, created)."""
        existing = self.get(name)
        if existing is not None:
            return existing, False
        with keyed_transaction(self._engine, f"pipeline:{name}") as conn:
            row = conn.execute(select(*_COLUMNS).where(PipelineRow.name == name)).one_or_none()
            if row is not None:
                return _config(row), False
            now = utcnow()
            conn.execute(
                insert(PipelineRow).values(
                    name=name, timezone=timezone, created_at=now, updated_at=now
                )
            )
        return PipelineConfig(name, timezone, now, now), True

    def set_timezone(self, name: str, timezone: str) -> tuple[str | None, PipelineConfig]:
        """Record `timezone` for the pipeline (the explicit change). Returns (old, new)."""
        with keyed_transaction(self._engine, f"pipeline:{name}") as conn:
            row = conn.execute(select(*_COLUMNS).where(PipelineRow.name == name)).one_or_none()
            now = utcnow()
            if row is None:
                conn.execute(
                    insert(PipelineRow).values(
                        name=name, timezone=timezone, created_at=now, updated_at=now
                    )
                )
                return None, PipelineConfig(name, timezone, now, now)
            old = _config(row)
            conn.execute(
                update(PipelineRow)
                .where(PipelineRow.name == name)
                .values(timezone=timezone, updated_at=now)
            )
            return old.timezone, PipelineConfig(name, timezone, old.created_at, now)
