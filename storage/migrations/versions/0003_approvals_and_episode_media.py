"""approvals and episode media

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "approvals",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("decided_by", sa.String(length=100), nullable=False),
        sa.Column("note", sa.String(length=2000), nullable=True),
        sa.Column("decided_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_approvals_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
    )
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_approvals_episode_pk"), ["episode_pk"], unique=False)

    op.create_table(
        "episode_media",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_episode_media_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episode_media")),
        sa.UniqueConstraint("episode_pk", "kind", name=op.f("uq_episode_media_episode_pk_kind")),
    )


def downgrade() -> None:

    op.drop_table("episode_media")
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_approvals_episode_pk"))

    op.drop_table("approvals")
