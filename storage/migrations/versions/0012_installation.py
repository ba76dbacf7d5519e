"""installation: this database's own random identity, sent with every provider reference

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

One row, made here once: `id` is 16 random hex characters (64 bits from `secrets`), never
derived from a path, a host name or a URL. Every client reference (and so every
Idempotency-Key) of a submission made after this revision starts with it, so two
installations that share a provider account (production and staging) never replay, find,
collect or cancel each other's jobs. Submissions recorded before keep the reference they
sent (`{item key}-{attempt}`): a lookup or a resend of an old open submission uses it.

`singleton` is the primary key and can only be 1: a second row cannot exist. Later
upgrades never touch the row; only `episodic db installation --renew` (for a database copied
from another installation) replaces the id. Downgrade drops the table; upgrading again makes
a new id (references already recorded keep theirs).
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

from episodic.storage.base import UTCDateTime, utcnow

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "installation",
        sa.Column("singleton", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("singleton = 1", name=op.f("ck_installation_one_row")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_installation")),
    )
    op.bulk_insert(table, [{"singleton": 1, "id": secrets.token_hex(8), "created_at": utcnow()}])


def downgrade() -> None:
    op.drop_table("installation")
