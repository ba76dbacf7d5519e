"""claims and leases on items, run membership, one submission per remote job

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("claim_run_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("lease_expires_at", UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f("ix_items_claim_owner"), ["claim_owner"], unique=False)

    op.create_table(
        "run_items",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("item_pk", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_pk"], ["items.id"], name=op.f("fk_run_items_item_pk_items"), ondelete="RESTRICT"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_items_run_id_runs"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("run_id", "item_pk", name=op.f("pk_run_items")),
    )
    with op.batch_alter_table("run_items", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_items_item_pk"), ["item_pk"], unique=False)
    # Existing runs keep the items they last owned.
    op.execute(
        "INSERT INTO run_items (run_id, item_pk) "
        "SELECT run_id, id FROM items WHERE run_id IS NOT NULL"
    )

    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.create_unique_constraint(
            batch_op.f("uq_submissions_provider_profile_remote_ref"),
            ["provider_profile", "remote_ref"],
        )


def downgrade() -> None:
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("uq_submissions_provider_profile_remote_ref"), type_="unique"
        )
    with op.batch_alter_table("run_items", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_items_item_pk"))
    op.drop_table("run_items")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_items_claim_owner"))
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("claim_run_id")
        batch_op.drop_column("claim_owner")
