"""hero candidates, and the plan each run was admitted for

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30

A hero run generates one video's hero image N times, each candidate its own paid item
(its own key). `candidate` is its ordinal (1..N); it is NULL for every other item, and for
a hero candidate `part` is 0 (a hero image has no part).

`runs.plan_id` is the recorded plan (`episode_plans.id`) a run was admitted for: once the
episode is re-planned, the run pays for nothing more (its claims are refused and it is
cancelled) and is not resumed. NULL for runs admitted before this revision (not checked).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("items", sa.Column("candidate", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("plan_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "plan_id")  # SQLite >= 3.35 drops them in place
    op.drop_column("items", "candidate")
