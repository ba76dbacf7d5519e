"""Provider-side cancels: whether a cancelled run's accepted job may be cancelled at the
provider, and the notes of what was asked and what the provider answered (episode events).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, insert, select

from episodic.core.records import EventKind
from episodic.storage import predicates, tx
from episodic.storage.base import utcnow
from episodic.storage.models import EpisodeEventRow, RunRow, SubmissionRow
from episodic.storage.runs import lock_membership_of_runs
from episodic.storage.tx import retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]


@retry_outages
class CancelStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def ask_provider_cancel(
        self, run_id: str, submission_pk: int, remote_ref: str, profile: str
    ) -> str | None:
        """Decide, for the cancel of `run_id`, whether its accepted job may be cancelled at
        the provider: the id of another live run that includes the job's item (the job is
        kept for it), or None after recording that the cancel is being asked (an episode
        event ``provider_cancel_asked``, committed before the provider's call).

        One transaction under the episode's `locks.lock_membership`, which run creation holds
        too: a run admitted over the item either is seen here (the job is kept) or is
        admitted after the record, and then knows, if it finds the job cancelled, that a
        cancel decided before it existed cancelled it (`cancel_asked_elsewhere`): it buys the
        item anew instead of failing it."""
        with tx.write(self.engine) as conn:
            lock_membership_of_runs(conn, [run_id])
            wanted = _wanted_elsewhere(conn, run_id, [submission_pk])
            if submission_pk in wanted:
                return wanted[submission_pk]
            _insert_event(
                conn,
                run_id,
                EventKind.PROVIDER_CANCEL_ASKED,
                {
                    "run_id": run_id,
                    "submission": submission_pk,
                    "remote_ref": remote_ref,
                    "profile": profile,
                },
            )
        return None

    def cancel_asked_elsewhere(self, episode_pk: int, submission_pk: int, run_id: str) -> bool:
        """Whether the cancel of a run other than `run_id` asked the provider to cancel this
        submission's job (`ask_provider_cancel`): a job such a run finds cancelled was
        cancelled on an operator's command, not by the provider."""
        with tx.read(self.engine) as conn:
            asked = conn.execute(
                select(_events.c.detail).where(
                    _events.c.episode_pk == episode_pk,
                    _events.c.kind == EventKind.PROVIDER_CANCEL_ASKED,
                )
            ).scalars()
            return any(
                isinstance(d, dict)
                and d.get("submission") == submission_pk
                and d.get("run_id") != run_id
                for d in asked
            )

    def record_provider_cancel(
        self, run_id: str, submission_pk: int, remote_ref: str, profile: str, answer: str
    ) -> None:
        """The ledger's note that a cancel was asked of the provider for an accepted job, and
        what it answered (an event of the run's episode, ``provider_cancel``)."""
        with tx.write(self.engine) as conn:
            _insert_event(
                conn,
                run_id,
                EventKind.PROVIDER_CANCEL,
                {
                    "run_id": run_id,
                    "submission": submission_pk,
                    "remote_ref": remote_ref,
                    "profile": profile,
                    "answer": answer[:200],
                },
            )

    def provider_cancel_answers(self, episode_pk: int) -> dict[int, str]:
        """The provider's latest answer to a cancel of each of the episode's submissions
        (``provider_cancel`` events, whichever run's cancel asked): submission pk -> answer."""
        with tx.read(self.engine) as conn:
            details = conn.execute(
                select(_events.c.detail)
                .where(
                    _events.c.episode_pk == episode_pk, _events.c.kind == EventKind.PROVIDER_CANCEL
                )
                .order_by(_events.c.id)
            ).scalars()
            return {
                int(d["submission"]): str(d.get("answer", ""))
                for d in details
                if isinstance(d, dict) and isinstance(d.get("submission"), int)
            }


def _wanted_elsewhere(
    conn: Connection, run_id: str, submission_pks: Sequence[int]
) -> dict[int, str]:
    """Of these submissions, those whose item another live run (pending, running or
    paused) includes: submission pk -> that run's id (the oldest such run). Cancelling
    such a job at the provider would make that run pay for the item again (a provider
    may bill a cancelled job: Replicate does)."""
    other = predicates.live_memberships([run_id]).subquery()
    rows = conn.execute(
        select(_subs.c.id, func.min(other.c.run_id))
        .join(other, other.c.item_pk == _subs.c.item_pk)
        .where(_subs.c.id.in_(list(submission_pks)))
        .group_by(_subs.c.id)
    ).all()
    return {int(pk): str(run) for pk, run in rows}


def _insert_event(conn: Connection, run_id: str, kind: EventKind, detail: dict[str, Any]) -> None:
    """An event of the run's episode."""
    episode_pk = conn.execute(select(_runs.c.episode_pk).where(_runs.c.id == run_id)).scalar_one()
    conn.execute(
        insert(_events).values(episode_pk=episode_pk, kind=kind, at=utcnow(), detail=detail)
    )
