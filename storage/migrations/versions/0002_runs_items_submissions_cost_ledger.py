"""runs items submissions cost ledger

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "episode_plans",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("playlist", sa.JSON(), nullable=False),
        sa.Column("playlist_sha256", sa.String(length=64), nullable=False),
        sa.Column("reference_sha256", sa.JSON(), nullable=False),
        sa.Column("source_path", sa.String(length=1024), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_episode_plans_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episode_plans")),
    )
    with op.batch_alter_table("episode_plans", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_episode_plans_episode_pk"), ["episode_pk"], unique=False
        )

    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("command", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("error_text", sa.String(length=2000), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_runs_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_episode_pk"), ["episode_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_fingerprint"), ["fingerprint"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_state"), ["state"], unique=False)

    op.create_table(
        "items",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=True),
        sa.Column("idempotency_key", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("video_id", sa.String(length=64), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.String(length=8000), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error_text", sa.String(length=2000), nullable=True),
        sa.Column("output_path", sa.String(length=1024), nullable=True),
        sa.Column("output_sha256", sa.String(length=64), nullable=True),
        sa.Column("force_resubmit", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_items_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_items_run_id_runs"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_items")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_items_idempotency_key")),
    )
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_items_episode_pk"), ["episode_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_items_run_id"), ["run_id"], unique=False)

    op.create_table(
        "submissions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("item_pk", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("client_reference", sa.String(length=64), nullable=False),
        sa.Column("provider_profile", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("remote_ref", sa.String(length=256), nullable=True),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("error_text", sa.String(length=2000), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("accepted_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["item_pk"],
            ["items.id"],
            name=op.f("fk_submissions_item_pk_items"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_submissions_run_id_runs"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submissions")),
        sa.UniqueConstraint("client_reference", name=op.f("uq_submissions_client_reference")),
    )
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_submissions_item_pk"), ["item_pk"], unique=False)

    op.create_table(
        "cost_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("episode_pk", sa.BigInteger(), nullable=False),
        sa.Column("submission_pk", sa.BigInteger(), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_pk"],
            ["episodes.id"],
            name=op.f("fk_cost_entries_episode_pk_episodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["submission_pk"],
            ["submissions.id"],
            name=op.f("fk_cost_entries_submission_pk_submissions"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cost_entries")),
        sa.UniqueConstraint("submission_pk", name=op.f("uq_cost_entries_submission_pk")),
    )
    with op.batch_alter_table("cost_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_cost_entries_episode_pk"), ["episode_pk"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("cost_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cost_entries_episode_pk"))

    op.drop_table("cost_entries")
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_submissions_item_pk"))

    op.drop_table("submissions")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_items_run_id"))
        batch_op.drop_index(batch_op.f("ix_items_episode_pk"))

    op.drop_table("items")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_state"))
        batch_op.drop_index(batch_op.f("ix_runs_fingerprint"))
        batch_op.drop_index(batch_op.f("ix_runs_episode_pk"))

    op.drop_table("runs")
    with op.batch_alter_table("episode_plans", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_episode_plans_episode_pk"))

    op.drop_table("episode_plans")
