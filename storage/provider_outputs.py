"""Accepted jobs and their outputs at the provider, as the ledger records them: the run's
jobs not collected yet (with when they were made: `runs show` tells how long the provider
keeps them), and outputs the provider deleted before they were collected (`close_gone`,
`lost_at_provider`: what `episodic.pipeline.gone` writes and the run's closing line reads).

An item whose newest submission's output is gone at the provider (failed, its output recorded
lost, the item failed) is not bought again by a resume, a retry or a generate: that job was
paid, and paying for its image twice is a decision only ``media restore --buy-again`` takes,
after quoting it (`output_gone` refuses the claim, `gone_items` keeps it out of a run's plan;
`buy_again` moves it back to pending once that command was confirmed).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Engine, Table, insert, select

from episodic.core.pricing import Charge
from episodic.core.states import ItemState, SubmissionState
from episodic.storage import dbapi, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.dbapi import DriverSQL
from episodic.storage.ledger import record_cost
from episodic.storage.models import CostEntryRow, ItemRow, LostOutputRow, RunItemRow, SubmissionRow
from episodic.storage.tx import retry_outages

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]

# Failed items whose newest submission failed with its output recorded lost: gone at the
# provider (`close_gone`), not a store's loss (whose submission stays succeeded).
_GONE = (
    "SELECT i.id FROM items i JOIN lost_outputs l ON l.item_pk = i.id "
    "JOIN submissions s ON s.id = l.submission_pk WHERE i.state = 'failed' "
    "AND s.state = 'failed' AND s.id = (SELECT max(n.id) FROM submissions n "
    "WHERE n.item_pk = i.id)"
)
_GONE_ITEM = DriverSQL(f"{_GONE} AND i.id = :b_item")
_GONE_OF_EPISODE = DriverSQL(f"{_GONE} AND i.episode_pk = :b_episode ORDER BY i.id")


def output_gone(conn: Connection, item_pk: int) -> bool:
    """The item is failed and its newest submission's output is gone at the provider."""
    return dbapi.fetch_one(conn, _GONE_ITEM, {"b_item": item_pk}) is not None


def gone_items(conn: Connection, episode_pk: int) -> set[int]:
    """The pks of the episode's items whose output is gone at the provider (`output_gone`)."""
    return {
        int(row[0]) for row in dbapi.fetch_all(conn, _GONE_OF_EPISODE, {"b_episode": episode_pk})
    }


@retry_outages
class ProviderOutputs:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def close_gone(
        self,
        submission_pk: int,
        item_pk: int,
        reason: str,
        *,
        episode_pk: int,
        charge: Charge,
    ) -> bool:
        """The provider proves the accepted job's output gone (deleted after its retention):
        in one transaction the submission closes failed with `charge` (it was paid) and its
        output is recorded lost (`lost_outputs`, as `media restore --buy-again` records an
        image the store lost; no key nor sha256: it was never downloaded), which is what
        `media restore --buy-again` buys again. False when it was already closed."""
        now = utcnow()
        with tx.write(self.engine) as conn:
            moved = conn.execute(statements.close_failed(submission_pk, reason, now)).rowcount
            if moved:
                record_cost(conn, episode_pk, submission_pk, charge, now)
                conn.execute(
                    insert(LostOutputRow).values(
                        item_pk=item_pk,
                        submission_pk=submission_pk,
                        key=None,
                        sha256="",
                        size=None,
                        media_type=None,
                        reason=reason[:2000],
                        lost_at=now,
                    )
                )
            return bool(moved)

    def buy_again(self, episode_pk: int, reason: str) -> list[int]:
        """`media restore --buy-again`, confirmed: each of the episode's items whose output is
        gone at the provider goes failed -> pending, to be bought again by the run that
        command starts (or any run after it); their lost outputs stay recorded. One
        transaction, rows in id order; returns the pks moved."""
        with tx.write(self.engine) as conn:
            moved = []
            for item_pk in sorted(gone_items(conn, episode_pk)):
                params = {"b_item": item_pk, "b_reason": reason[:2000]}
                if dbapi.rowcount(conn, statements.BUY_GONE_AGAIN, params):
                    moved.append(item_pk)
            return moved

    def lost_at_provider(self, run_id: str) -> tuple[int, dict[str, int]]:
        """The paid calls, of the run's items not completed since, whose output the provider
        deleted before it was collected (`close_gone`): how many, and what they cost per
        currency."""
        lost: Table = LostOutputRow.__table__  # type: ignore[assignment]
        costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
        members: Table = RunItemRow.__table__  # type: ignore[assignment]
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(costs.c.amount_micros, costs.c.currency)
                .select_from(
                    members.join(_items, _items.c.id == members.c.item_pk)
                    .join(_subs, _subs.c.item_pk == _items.c.id)
                    .join(lost, lost.c.submission_pk == _subs.c.id)
                    .join(costs, costs.c.submission_pk == _subs.c.id)
                )
                .where(
                    members.c.run_id == run_id,
                    _subs.c.state == SubmissionState.FAILED,
                    _items.c.state != ItemState.COMPLETED,
                )
            ).all()
        totals: dict[str, int] = {}
        for amount, currency in rows:
            totals[str(currency)] = totals.get(str(currency), 0) + int(amount)
        return len(rows), totals

    def accepted_of_run(self, run_id: str) -> list[tuple[str, str, datetime]]:
        """The run's accepted jobs not collected yet: (provider profile, remote reference,
        when the job was made), oldest first."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_subs.c.provider_profile, _subs.c.remote_ref, _subs.c.accepted_at)
                .where(_subs.c.run_id == run_id, _subs.c.state == SubmissionState.ACCEPTED)
                .order_by(_subs.c.accepted_at, _subs.c.id)
            ).all()
        return [
            (str(row.provider_profile), str(row.remote_ref), row.accepted_at)
            for row in rows
            if row.remote_ref is not None and row.accepted_at is not None
        ]
