"""The ledger's reads behind `episodic spend` and `check`'s spend totals.

Every line is one paid call, dated by its submission's ``created_at`` (`episodic.core.periods`: the
same date the period budgets count it by): a billed call (its cost entry) or a call in
flight (an open submission, counted at what it was reserved at). Read-only; one snapshot per
call of `spend_lines`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, Table, distinct, func, select

from episodic.core.states import OPEN_SUBMISSION_STATES
from episodic.storage import tx
from episodic.storage.models import CostEntryRow, EpisodeRow, ItemRow, PipelineRow, SubmissionRow
from episodic.storage.tx import retry_outage

_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class SpendLine:
    """One paid call of a pipeline: billed (`amount_micros`, its cost entry) or in flight
    (`reserved_micros`, an open submission's reservation)."""

    pipeline: str
    episode_id: str
    profile: str
    currency: str
    created_at: datetime  # the submission's: when the paid call was committed
    billed: bool
    amount_micros: int  # billed: the cost entry's amount; in flight: 0
    reserved_micros: int  # in flight: the reservation; billed: 0


@retry_outage
def spend_lines(
    engine: Engine, pipeline: str, start: datetime | None = None, end: datetime | None = None
) -> list[SpendLine]:
    """The pipeline's paid calls whose submission was created in ``[start, end)`` (UTC;
    None: unbounded): every cost entry, and every open submission reserved above 0."""
    with _snapshot(engine) as conn:
        return _lines(conn, pipeline, start, end)


Sums = dict[str, tuple[int, int]]  # currency -> (cost entries, their sum in micro-units)
Periods = Callable[[list[SpendLine]], list[tuple[str, datetime, datetime]]]


@retry_outage
def audited_spend(
    engine: Engine, pipeline: str, periods: Periods
) -> tuple[list[SpendLine], Sums, dict[str, Sums]]:
    """What `check` holds the report against, read at one moment: the pipeline's every
    paid call (`spend_lines`), the ledger's own SQL aggregate of its cost entries, and the
    same aggregate of each period `periods` names for those lines (label, start, end: the
    calls whose submission was created in ``[start, end)``, as the budgets count them)."""
    with _snapshot(engine) as conn:
        lines = _lines(conn, pipeline, None, None)
        whole = _sums(conn, pipeline, None, None)
        each = {label: _sums(conn, pipeline, start, end) for label, start, end in periods(lines)}
    return lines, whole, each


def _sums(conn: Connection, pipeline: str, start: datetime | None, end: datetime | None) -> Sums:
    query = (
        select(_costs.c.currency, func.count(), func.sum(_costs.c.amount_micros))
        .join(_episodes, _episodes.c.id == _costs.c.episode_pk)
        .where(_episodes.c.pipeline == pipeline)
        .group_by(_costs.c.currency)
    )
    if start is not None or end is not None:
        query = query.join(_subs, _subs.c.id == _costs.c.submission_pk)
    if start is not None:
        query = query.where(_subs.c.created_at >= start)
    if end is not None:
        query = query.where(_subs.c.created_at < end)
    rows = conn.execute(query).all()
    return {str(currency): (int(count), int(total)) for currency, count, total in rows}


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """One read transaction whose statements see one moment (PostgreSQL: REPEATABLE READ;
    SQLite: one transaction), so a run paying meanwhile never splits a report."""
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    with conn, conn.begin():
        yield conn


def _lines(
    conn: Connection, pipeline: str, start: datetime | None, end: datetime | None
) -> list[SpendLine]:
    billed = (
        select(
            _episodes.c.episode_id,
            _subs.c.provider_profile,
            _costs.c.currency,
            _subs.c.created_at,
            _costs.c.amount_micros,
        )
        .select_from(_costs)
        .join(_subs, _subs.c.id == _costs.c.submission_pk)
        .join(_episodes, _episodes.c.id == _costs.c.episode_pk)
        .where(_episodes.c.pipeline == pipeline)
        .order_by(_costs.c.id)
    )
    open_ = (
        select(
            _episodes.c.episode_id,
            _subs.c.provider_profile,
            _subs.c.currency,
            _subs.c.created_at,
            _subs.c.reserved_micros,
        )
        .select_from(_subs)
        .join(_items, _items.c.id == _subs.c.item_pk)
        .join(_episodes, _episodes.c.id == _items.c.episode_pk)
        .where(
            _episodes.c.pipeline == pipeline,
            _subs.c.state.in_([str(s) for s in OPEN_SUBMISSION_STATES]),
            _subs.c.reserved_micros > 0,
            ~select(_costs.c.id).where(_costs.c.submission_pk == _subs.c.id).exists(),
        )
        .order_by(_subs.c.id)
    )
    if start is not None:
        billed = billed.where(_subs.c.created_at >= start)
        open_ = open_.where(_subs.c.created_at >= start)
    if end is not None:
        billed = billed.where(_subs.c.created_at < end)
        open_ = open_.where(_subs.c.created_at < end)
    lines = [
        SpendLine(pipeline, r[0], r[1], r[2], r[3], True, int(r[4]), 0)
        for r in conn.execute(billed).all()
    ]
    lines += [
        SpendLine(pipeline, r[0], r[1], r[2] or "USD", r[3], False, 0, int(r[4]))
        for r in conn.execute(open_).all()
    ]
    return lines


@retry_outage
def known_pipelines(engine: Engine) -> dict[str, str | None]:
    """Every pipeline the database knows -> its recorded timezone (None: episodes of a
    pipeline that has no recorded row, from before timezones were recorded)."""
    with tx.read(engine) as conn:
        recorded = conn.execute(select(PipelineRow.name, PipelineRow.timezone)).all()
        named = conn.execute(select(distinct(_episodes.c.pipeline))).scalars().all()
    found: dict[str, str | None] = {str(name): None for name in named}
    found.update({str(name): str(zone) for name, zone in recorded})
    return dict(sorted(found.items()))
