"""open submissions hold provider slots: an index to count them per profile

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29

A job the provider accepted keeps running there whatever happens to the claim that sent it
(a holder interrupted, killed, or that left the job for later collection). The provider
limit therefore counts, besides running claims, the open submissions (intent, unknown,
accepted) of the profile made within the profile's `max_job_s`; this index keeps that count
to the few open rows of one profile.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_submissions_profile_state_created",
        "submissions",
        ["provider_profile", "state", "created_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_submissions_profile_state_created", table_name="submissions")
