"""dispatch dedup (fingerprint lookups, explicit keys) and run leases for the sweep

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("batch_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("lease_expires_at", UTCDateTime(), nullable=True))
        # The dedup decision: newest runs of one fingerprint (an index range, not a scan).
        batch_op.drop_index(batch_op.f("ix_runs_fingerprint"))
        batch_op.create_index(
            "ix_runs_fingerprint_created_at", ["fingerprint", "created_at"], unique=False
        )
        # The sweep: active runs by age (a handful among millions of finished ones).
        batch_op.create_index("ix_runs_state_created_at", ["state", "created_at"], unique=False)
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.create_index("ix_items_state_lease", ["state", "lease_expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index("ix_items_state_lease")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_state_created_at")
        batch_op.drop_index("ix_runs_fingerprint_created_at")
        batch_op.create_index(batch_op.f("ix_runs_fingerprint"), ["fingerprint"], unique=False)
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("batch_id")
        batch_op.drop_column("idempotency_key")
        batch_op.drop_column("request_sha256")
