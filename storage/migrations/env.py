"""Alembic environment: always run with a connection handed in by `episodic.storage.schema`."""

from __future__ import annotations

from alembic import context

from episodic.storage import models  # noqa: F401  (registers the tables on Base.metadata)
from episodic.storage.base import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `episodic db upgrade` (storage.schema.upgrade)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
