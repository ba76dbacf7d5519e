"""reference images of plans, content-addressed

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30

A playlist may name one of its reference assets as the reference image sent with every item
(`reference_image`). Its bytes are recorded with the plan, keyed by their sha256 (the hash
already in every item key), so what was planned is what is sent, from any machine that
reaches the database.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reference_images",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("media_type", sa.String(32), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reference_images")
