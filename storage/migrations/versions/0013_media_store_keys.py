"""media store keys: what the store holds for an item's image and an episode's media

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

An image is kept in the media store (`episodic.storage.media`) under a store-relative,
content-addressed key, never under a machine path: `items.output_key` (String(1024)) with
its `output_size` (bytes) and `output_media_type` (``image/png``, ``image/jpeg``,
``image/webp``) next to the `output_sha256` already recorded; `episode_media` gains the same
three as `key`, `size` and `media_type`. Rows written from this revision on record a key
and never an absolute path.

`items.output_path` and `episode_media.path` stay as the absolute path of rows written
before the store (a later import copies those files into the store and clears them), so
`episode_media.path` becomes nullable. Every new column is nullable: existing rows have no
key until they are imported. Downgrade drops the new columns (a development tool: an image
recorded only by its key keeps its bytes in the store, but its row no longer names them)
and fails while an episode's media row has no path (the older schema requires one).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # In place on both backends (SQLite adds and, from 3.35, drops columns itself): a batch
    # copy of `items` would drop a table that submissions reference.
    op.add_column("items", sa.Column("output_key", sa.String(length=1024), nullable=True))
    op.add_column("items", sa.Column("output_size", sa.BigInteger(), nullable=True))
    op.add_column("items", sa.Column("output_media_type", sa.String(length=64), nullable=True))
    with op.batch_alter_table("episode_media", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("size", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("media_type", sa.String(length=64), nullable=True))
        batch_op.alter_column("path", existing_type=sa.String(length=1024), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("episode_media", schema=None) as batch_op:
        batch_op.alter_column("path", existing_type=sa.String(length=1024), nullable=False)
        batch_op.drop_column("media_type")
        batch_op.drop_column("size")
        batch_op.drop_column("key")
    op.drop_column("items", "output_media_type")
    op.drop_column("items", "output_size")
    op.drop_column("items", "output_key")
