"""episodes and their append-only history

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "episodes",
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("pipeline", sa.String(63), nullable=False),
        sa.Column("week_id", sa.String(8), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.String(24), nullable=False),
        sa.Column("allocation_key", sa.String(512), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
        sa.UniqueConstraint("pipeline", "episode_id", name=op.f("uq_episodes_pipeline_episode_id")),
        sa.UniqueConstraint(
            "pipeline", "allocation_key", name=op.f("uq_episodes_pipeline_allocation_key")
        ),
        sa.UniqueConstraint(
            "pipeline", "week_id", "sequence", name=op.f("uq_episodes_pipeline_week_id_sequence")
        ),
    )
    op.create_table(
        "episode_events",
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_episode_events_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episode_events")),
    )
    op.create_index(
        op.f("ix_episode_events_episode_pk"), "episode_events", ["episode_pk"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_episode_events_episode_pk"), table_name="episode_events")
    op.drop_table("episode_events")
    op.drop_table("episodes")
