"""This database's installation id: the scope of every reference sent to a provider.

Two installations (production and staging: two databases) may share one provider account.
A client reference made only of the item's key and attempt is the same in both, so an
idempotent provider would hand staging production's job, and a lookup would find it. Every
client reference (also the Idempotency-Key of its create) therefore starts with the id of
the installation that sent it: ``{installation id}-{item key}-{attempt}``.

The id is 16 random hex characters, made once by migration 0012 and kept in the one-row
``installation`` table; never derived from a path, a host name or a URL (those change when a
database moves, and agree between copies that are not the same installation). A submission
records the reference it sent, and everything that talks to the provider about it later (a
lookup, an idempotent resend, a cancel by its remote reference) uses the recorded one, so a
submission made before the upgrade keeps its ``{item key}-{attempt}``.

A database copied from another (a dump restored into staging, ``CREATE DATABASE ...
TEMPLATE``, a copied SQLite file) carries the original's id: docs/providers.md says how to
give the copy its own (`episodic db installation --renew`, `renew` here).
"""

from __future__ import annotations

import re
import secrets

from sqlalchemy import Connection, Engine, inspect, text

from episodic.core.errors import SchemaNotCurrent
from episodic.storage import statements, tx
from episodic.storage.base import utcnow

ID = re.compile(r"[0-9a-f]{16}")
_READ = text("SELECT id FROM installation WHERE singleton = 1")
_RENEW = text("UPDATE installation SET id = :b_id, created_at = :b_now WHERE singleton = 1")
# The original's media store is not the copy's: the copy records its own at its first write
# (`episodic.storage.store_identity`), or the original's again when told to use it.
_FORGET_STORE = text("DELETE FROM media_store")


def read(conn: Connection) -> str:
    """The installation id, in the caller's transaction. Raises `SchemaNotCurrent` when the
    database has none (not upgraded to 0012)."""
    found = conn.execute(_READ).scalar_one_or_none()
    if found is None or not ID.fullmatch(str(found)):
        raise SchemaNotCurrent("this database has no installation id: run `episodic db upgrade`")
    return str(found)


def installation_id(engine: Engine) -> str:
    with tx.read(engine) as conn:
        return read(conn)


def find(engine: Engine) -> str | None:
    """The installation id, or None for a database not upgraded to 0012 (for display)."""
    with tx.read(engine) as conn:
        if not inspect(conn).has_table("installation"):
            return None
        found = conn.execute(_READ).scalar_one_or_none()
    return None if found is None else str(found)


def renew(engine: Engine) -> tuple[str, str, int]:
    """Give this database a new random id (after it was copied from another installation);
    returns (old, new, disowned). Submissions already recorded keep the references they
    sent; those still open (intent, accepted, unknown) under the old id are the original
    installation's jobs, so they are closed as failed, with no cost, in the same
    transaction (``disowned`` of them): this database never collects, reconciles or cancels
    them, and its next run of their items buys its own. The media store the original
    recorded is forgotten too: the copy adopts the store it is configured with at its first
    write (one that holds the copied images, if it has any: `episodic.storage.store_identity`)."""
    new = secrets.token_hex(8)
    now = utcnow()
    with tx.write(engine) as conn:
        old = read(conn)
        conn.execute(_RENEW, {"b_id": new, "b_now": now})
        disowned = conn.execute(
            statements.DISOWN,
            {
                "b_why": f"a job of installation {old}, this database's original: "
                "never collected or cancelled here (db installation --renew)",
                "b_now": now,
                "b_prefix": f"{old}-%",
            },
        ).rowcount
        conn.execute(_FORGET_STORE)
    return old, new, int(disowned)


def reference(installation: str, item_key: str, attempt: int) -> str:
    """The client reference of paid call `attempt` of an item (what
    `episodic.storage.statements.REFERENCE_SQL` builds in SQL)."""
    return f"{installation}-{item_key}-{attempt}"
