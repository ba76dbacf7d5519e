"""exact money: costs in micro-units with their basis, reservations, period budgets

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

Money was whole minor units (cents); a price of $0.003 could not be written. Every amount is
now an integer of micro-units (millionths of the currency unit, `episodic.core.money`):

- ``cost_entries.amount_minor`` becomes ``amount_micros`` = amount_minor x 10,000 (exact),
  beside the ``basis`` it was charged on, the measured ``quantity`` and the
  ``unit_price_micros`` (`core.pricing`), so every cost can be recomputed. A row from before
  was a flat per-image price: basis ``per_image``, quantity 1, unit price its amount.
- ``submissions.reserved_micros`` and ``currency``: what a paid call was reserved at when its
  intent was committed (the price's estimate), counted by the caps and budgets until it
  settles. Rows from before reserve 0 (their currency unknown): only an upgrade's open calls
  are affected, once.
- ``pipeline_budgets``: a pipeline's budget per period (``week``, ``month``) in one currency,
  set by ``episodic pipelines set-budget``.
- ``ix_submissions_run`` and ``ix_submissions_created``: the run's spend and a period's spend
  are read in every claim that buys.

Downgrade converts back to whole minor units, rounding each amount *up* to a cent (a
sub-cent cost cannot be written there), and drops what it added.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

BASES = "'per_image', 'per_megapixel', 'per_whole_megapixel', 'per_second', 'reported'"


def upgrade() -> None:
    with op.batch_alter_table("cost_entries", schema=None) as batch:
        batch.add_column(sa.Column("amount_micros", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("basis", sa.String(length=24), nullable=True))
        batch.add_column(sa.Column("quantity", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("unit_price_micros", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE cost_entries SET amount_micros = amount_minor * 10000, basis = 'per_image', "
        "quantity = 1, unit_price_micros = amount_minor * 10000"
    )
    with op.batch_alter_table("cost_entries", schema=None) as batch:
        batch.alter_column("amount_micros", existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("basis", existing_type=sa.String(length=24), nullable=False)
        batch.alter_column("quantity", existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("unit_price_micros", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_column("amount_minor")
        batch.create_check_constraint("basis_known", f"basis IN ({BASES})")
        batch.create_check_constraint(
            "amounts_not_negative",
            "amount_micros >= 0 AND quantity >= 0 AND unit_price_micros >= 0",
        )
    # Plain ALTERs on `submissions` (no batch copy: cost_entries references it, and SQLite
    # would have to drop and recreate it with foreign keys on).
    op.add_column(
        "submissions",
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column("submissions", sa.Column("currency", sa.String(length=3), nullable=True))
    op.create_index("ix_submissions_run", "submissions", ["run_id"])
    op.create_index("ix_submissions_created", "submissions", ["created_at"])
    op.create_table(
        "pipeline_budgets",
        sa.Column("pipeline", sa.String(length=63), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("period IN ('week', 'month')", name=op.f("ck_pipeline_budgets_period")),
        sa.CheckConstraint("amount_micros >= 0", name=op.f("ck_pipeline_budgets_amount")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["pipelines.name"],
            name=op.f("fk_pipeline_budgets_pipeline_pipelines"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("pipeline", "period", name=op.f("pk_pipeline_budgets")),
    )


def downgrade() -> None:
    op.drop_table("pipeline_budgets")
    op.drop_index("ix_submissions_created", table_name="submissions")
    op.drop_index("ix_submissions_run", table_name="submissions")
    op.drop_column("submissions", "currency")  # SQLite >= 3.35 drops them in place
    op.drop_column("submissions", "reserved_micros")
    with op.batch_alter_table("cost_entries", schema=None) as batch:
        batch.add_column(sa.Column("amount_minor", sa.BigInteger(), nullable=True))
    op.execute("UPDATE cost_entries SET amount_minor = (amount_micros + 9999) / 10000")
    with op.batch_alter_table("cost_entries", schema=None) as batch:
        batch.alter_column("amount_minor", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_constraint("amounts_not_negative", type_="check")
        batch.drop_constraint("basis_known", type_="check")
        batch.drop_column("unit_price_micros")
        batch.drop_column("quantity")
        batch.drop_column("basis")
        batch.drop_column("amount_micros")
