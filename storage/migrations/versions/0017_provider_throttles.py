"""provider throttles: when a provider profile may be sent a new paid call again

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

``provider_throttles``: one row per provider profile that a provider refused for now (429, or
503 with ``Retry-After``): ``not_before`` is the moment it said to come back (at most
`episodic.pipeline.paid_call`'s bound per wait), ``detail`` its own words. Every claim of a new paid
call of that profile, in any run, process or machine, is refused ``throttled`` until then
(`episodic.storage.claims`), so the workers sharing an account wait together instead of each asking
again. A row whose moment has passed means nothing; it is overwritten by the next throttle.
Downgrade drops the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_throttles",
        sa.Column("profile", sa.String(length=64), nullable=False),
        sa.Column("not_before", UTCDateTime(), nullable=False),
        sa.Column("detail", sa.String(length=500), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("profile", name=op.f("pk_provider_throttles")),
    )


def downgrade() -> None:
    op.drop_table("provider_throttles")
