"""media store keys: what the store holds for an item's image and an episode's media

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

An image is kept in the media store (`storage.media`) under a store-relative,
content-addressed key, never under a machine path: `items.output_key` (String(1024)) with
its `output_size` (bytes) and `output_media_type` (``image/png``, ``image/jpeg``,
``image/webp``) next to the `output_sha256` already recorded; `episode_media` gains the same
three as `key`, `size` and `media_type`. Rows written from this revision on record a key
and never an absolute path.

`items.output_path` and `episode_media.path` stay as the absolute path of rows written
before the store (a later import copies those files into the store and clears them), so
`episode_media.path` becomes nullable. Every new column is nullable: existing rows have no
key until they are imported. Downgrade drops the new columns; it refuses while a row has a
key and no legacy path (its image would be unreachable in the older schema).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_key", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("output_size", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("output_media_type", sa.String(length=64), nullable=True))
    with op.batch_alter_table("episode_media", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("size", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("media_type", sa.String(length=64), nullable=True))
        batch_op.alter_column("path", existing_type=sa.String(length=1024), nullable=True)


def downgrade() -> None:
    bind = op.get_bind()
    unreachable = bind.execute(
        sa.text(
            "SELECT (SELECT count(*) FROM items WHERE output_key IS NOT NULL "
            "AND output_path IS NULL) + (SELECT count(*) FROM episode_media "
            "WHERE path IS NULL)"
        )
    ).scalar_one()
    if unreachable:
        raise RuntimeError(
            f"{unreachable} images or episode media are recorded only by their media store "
            "key; downgrading below 0013 would lose where they are"
        )
    with op.batch_alter_table("episode_media", schema=None) as batch_op:
        batch_op.alter_column("path", existing_type=sa.String(length=1024), nullable=False)
        batch_op.drop_column("media_type")
        batch_op.drop_column("size")
        batch_op.drop_column("key")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("output_media_type")
        batch_op.drop_column("output_size")
        batch_op.drop_column("output_key")
