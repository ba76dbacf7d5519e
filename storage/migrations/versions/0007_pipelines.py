"""pipelines: one timezone per pipeline, shared by every worker and schedule

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29

Existing pipelines get no row: the first process that needs a pipeline's timezone records
its EPISODIC_TIMEZONE (UTC when unset), as for a new pipeline.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pipelines")),
    )


def downgrade() -> None:
    op.drop_table("pipelines")
