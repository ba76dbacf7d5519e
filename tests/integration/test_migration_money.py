"""Migration 0016 (exact money): every recorded cost converts exactly from whole minor
units to micro-units, with the basis it was charged on; downgrading rounds a sub-cent cost
up to a cent (never down) and upgrading again is exact. On SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from episodic.storage.schema import HEAD_REVISION, current_revision, downgrade, upgrade

# amounts in whole cents as a ledger before 0016 holds them: nothing, a cent, a price, the
# largest one image may cost (10 million units)
MINOR = [0, 1, 4, 25, 1_000_000_000]


def _to(engine: Engine, revision: str, down: bool = False) -> None:
    (downgrade if down else upgrade)(engine, revision)


def _insert(engine: Engine, table: str, **values: Any) -> None:
    """A row with `values`, every other NOT NULL column without a default given a plain value
    of its type (the rows only have to exist for the costs that refer to them)."""
    for column in inspect(engine).get_columns(table):
        name = column["name"]
        if name in values or column["nullable"] or column.get("default") is not None:
            continue
        kind = str(column["type"]).upper()
        if "INT" in kind:
            values[name] = 1
        elif "BOOL" in kind:
            values[name] = False
        elif "DATE" in kind or "TIME" in kind:
            values[name] = "2026-08-03 10:00:00"
        else:
            values[name] = f"{table}-{name}"
    names = ", ".join(values)
    marks = ", ".join(f":{n}" for n in values)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), values)


def _ledger_before_0016(engine: Engine) -> None:
    _to(engine, "0015")
    _insert(
        engine,
        "episodes",
        id=1,
        pipeline="weekly",
        episode_id="2026-W32-1",
        week_id="2026-W32",
        state="generated",
    )
    _insert(engine, "runs", id="run-1", episode_pk=1, state="completed", params="{}")
    for n, minor in enumerate(MINOR, start=1):
        _insert(
            engine,
            "items",
            id=n,
            episode_pk=1,
            idempotency_key=f"key{n}",
            position=n,
            video_id=f"v{n:02}",
            state="completed",
        )
        _insert(
            engine,
            "submissions",
            id=n,
            item_pk=n,
            run_id="run-1",
            attempt=1,
            client_reference=f"ref{n}",
            provider_profile="fake",
            state="succeeded",
        )
        _insert(
            engine,
            "cost_entries",
            id=n,
            episode_pk=1,
            submission_pk=n,
            amount_minor=minor,
            currency="USD",
        )


def _costs(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT amount_micros, basis, quantity, unit_price_micros, currency "
                    "FROM cost_entries ORDER BY id"
                )
            )
        ]


def test_0016_converts_every_cost_exactly_and_records_its_basis(empty_engine: Engine) -> None:
    _ledger_before_0016(empty_engine)
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION
    assert _costs(empty_engine) == [(m * 10_000, "per_image", 1, m * 10_000, "USD") for m in MINOR]
    with empty_engine.connect() as conn:  # calls from before reserve nothing
        assert conn.execute(text("SELECT sum(reserved_micros) FROM submissions")).scalar() == 0
        total = conn.execute(text("SELECT sum(amount_micros) FROM cost_entries")).scalar()
    assert total == sum(MINOR) * 10_000  # the sum is the old sum, exactly


def test_0016_refuses_a_cost_row_of_an_unknown_basis_or_a_negative_amount(
    empty_engine: Engine,
) -> None:
    _ledger_before_0016(empty_engine)
    upgrade(empty_engine)
    for change in ("basis = 'per_hour'", "amount_micros = -1", "quantity = -5"):
        with pytest.raises(IntegrityError), empty_engine.begin() as conn:
            conn.execute(text(f"UPDATE cost_entries SET {change} WHERE id = 1"))


def test_downgrading_0016_rounds_sub_cent_costs_up_and_upgrading_again_is_exact(
    empty_engine: Engine,
) -> None:
    _ledger_before_0016(empty_engine)
    upgrade(empty_engine)
    with empty_engine.begin() as conn:  # a cost that only exact money can hold: $0.003
        conn.execute(
            text(
                "UPDATE cost_entries SET amount_micros = 3000, unit_price_micros = 3000 "
                "WHERE id = 2"
            )
        )
    _to(empty_engine, "0015", down=True)
    with empty_engine.connect() as conn:
        minor = conn.execute(text("SELECT amount_minor FROM cost_entries ORDER BY id")).scalars()
        assert list(minor) == [0, 1, 4, 25, 1_000_000_000]  # 0.003 -> 0.01, never 0.00
    assert "pipeline_budgets" not in inspect(empty_engine).get_table_names()
    upgrade(empty_engine)
    assert [row[0] for row in _costs(empty_engine)] == [m * 10_000 for m in MINOR]
