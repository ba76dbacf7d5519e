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
    # Plain ALTERs (no batch copy of `items`: other tables reference it, and SQLite would
    # have to drop and recreate it with foreign keys on).
    op.add_column("items", sa.Column("claim_profile", sa.String(length=64), nullable=True))
    op.add_column("items", sa.Column("claim_token", sa.String(length=32), nullable=True))
    op.create_index("ix_items_claim_profile_state", "items", ["claim_profile", "state"])


def downgrade() -> None:
    op.drop_index("ix_items_claim_profile_state", table_name="items")
    op.drop_column("items", "claim_token")  # SQLite >= 3.35 drops them in place
    op.drop_column("items", "claim_profile")
