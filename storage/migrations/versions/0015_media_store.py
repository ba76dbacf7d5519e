"""media store: the identity of the store this database records its paid media in

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

One row at most (`singleton` can only be 1), made by the first command that writes media
(storage.store_identity), not here: `store_id` is the uuid in the store's own marker object
(``episodic-store.json`` at its root) and `url` the store's public URL (no credentials).
A machine whose configured store has another marker, or none, is refused before it spends or
buys again. `episodic media import --from URL` replaces the row after copying every image to
the new store. Downgrade drops the table; the next writing command adopts a store again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "media_store",
        sa.Column("singleton", sa.Integer(), nullable=False),
        sa.Column("store_id", sa.String(length=36), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("singleton = 1", name=op.f("ck_media_store_one_row")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_media_store")),
    )


def downgrade() -> None:
    op.drop_table("media_store")
