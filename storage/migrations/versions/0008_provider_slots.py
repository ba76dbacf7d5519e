"""provider slots: running items record the provider profile whose limit they count against

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29

The provider limit holds across processes, runs and machines: an item may only be claimed
while fewer than the profile's `max_concurrency` items of that profile are running with a
live lease. Items running at upgrade time have no profile and count against none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_profile", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "ix_items_claim_profile_state", ["claim_profile", "state"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index("ix_items_claim_profile_state")
        batch_op.drop_column("claim_profile")
