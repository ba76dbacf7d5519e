"""What `episodic runs adopt` reads of the ledger: an item's latest paid call, and which
item records a job the operator names (`pipeline.adopt`; the write is `LedgerStore.accept`)."""

from __future__ import annotations

from sqlalchemy import Engine, Table, select

from episodic.core.playlist import item_label
from episodic.core.runs import Submission
from episodic.storage import tx
from episodic.storage.ledger import submission_of
from episodic.storage.models import EpisodeRow, ItemRow, SubmissionRow

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]


def latest_submission(engine: Engine, item_pk: int) -> tuple[Submission, str] | None:
    """The item's latest paid call (highest attempt) and its provider profile, or None."""
    with tx.read(engine) as conn:
        row = conn.execute(
            select(_subs)
            .where(_subs.c.item_pk == item_pk)
            .order_by(_subs.c.attempt.desc(), _subs.c.id.desc())
            .limit(1)
        ).first()
    return None if row is None else (submission_of(row), str(row.provider_profile))


def recorded_for(engine: Engine, remote_ref: str) -> tuple[str, str] | None:
    """Which item records the provider's job `remote_ref`: (episode id, item idempotency
    label) of its submission, or None."""
    with tx.read(engine) as conn:
        row = conn.execute(
            select(_episodes.c.episode_id, _items.c.video_id, _items.c.part, _items.c.candidate)
            .select_from(_subs)
            .join(_items, _items.c.id == _subs.c.item_pk)
            .join(_episodes, _episodes.c.id == _items.c.episode_pk)
            .where(_subs.c.remote_ref == remote_ref)
            .limit(1)
        ).first()
    if row is None:
        return None
    return str(row.episode_id), item_label(row.video_id, row.part, row.candidate)
