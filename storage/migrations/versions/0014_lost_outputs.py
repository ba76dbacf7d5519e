"""lost outputs: a completed image the store lost and its provider no longer served

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

`episodic media restore --buy-again` sends such an item back to pending (a new paid
attempt). The evidence stays: `lost_outputs` records which succeeded submission's output
was lost (that submission keeps its state and its cost), the key, sha256, size and media
type it had, why, and when. One row per submission: an output is lost once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lost_outputs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("item_pk", sa.BigInteger(), nullable=False),
        sa.Column("submission_pk", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("media_type", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=2000), nullable=False),
        sa.Column("lost_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_pk"],
            ["items.id"],
            name=op.f("fk_lost_outputs_item_pk_items"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["submission_pk"],
            ["submissions.id"],
            name=op.f("fk_lost_outputs_submission_pk_submissions"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lost_outputs")),
        sa.UniqueConstraint("submission_pk", name=op.f("uq_lost_outputs_submission_pk")),
    )
    op.create_index(op.f("ix_lost_outputs_item_pk"), "lost_outputs", ["item_pk"])


def downgrade() -> None:
    op.drop_index(op.f("ix_lost_outputs_item_pk"), table_name="lost_outputs")
    op.drop_table("lost_outputs")
