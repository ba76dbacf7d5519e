"""The database keeps the state machines, on SQLite and PostgreSQL: each state column accepts
exactly its machine's states, an item never has two submissions open, a claim whose Python
decision is wrong is refused by its statement's guard or by the schema (nothing is paid), and
the upgrade that adds all this refuses a ledger that breaks it, naming the rows, changing
nothing.

Paid calls are counted at the fake provider (its job log), never from our tables."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from episodic.core.errors import InvalidTransition, MigrationRefused
from episodic.core.exit_codes import ExitCode
from episodic.core.states import STATES, TABLES
from episodic.storage import claims
from episodic.storage.base import utcnow
from episodic.storage.dbapi import DriverSQL
from episodic.storage.models import ItemRow, SubmissionRow
from episodic.storage.schema import current_revision, upgrade
from tests.generation import Episode, jobs_per_key, new_episode, write_playlist

# The partial unique index's refusal as each backend words it (SQLite names the column).
ONE_OPEN = r"uq_submissions_one_open_per_item|UNIQUE constraint failed: submissions\.item_pk"


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def episode(engine: Engine, database_url: str) -> Episode:
    return new_episode(engine)


def _one_id(engine: Engine, table: str) -> object:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT id FROM {table} ORDER BY id LIMIT 1")).scalar_one()


@pytest.mark.parametrize("machine", sorted(STATES))
def test_every_state_column_accepts_exactly_its_machines_states(
    episode: Episode, tmp_path: Path, machine: str
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    episode.generate()  # an episode, a run, an item and a submission exist
    table, row_id = TABLES[machine], _one_id(episode.engine, TABLES[machine])
    move = text(f"UPDATE {table} SET state = :state WHERE id = :id")
    for state in STATES[machine]:
        with episode.engine.begin() as conn:
            assert conn.execute(move, {"state": state.value, "id": row_id}).rowcount == 1
    for bogus in ("bogus", "", "Running", "pending "):
        with (
            pytest.raises(IntegrityError, match=f"ck_{table}_state_known"),
            episode.engine.begin() as conn,
        ):
            conn.execute(move, {"state": bogus, "id": row_id})


def _second_submission(engine: Engine, state: str, tag: str = "second") -> None:
    """A copy of the item's first submission in `state`, as a further paid call of it."""
    with engine.begin() as conn:
        first = conn.execute(select(SubmissionRow).where(SubmissionRow.attempt == 1)).one()
        conn.execute(
            insert(SubmissionRow).values(
                item_pk=first.item_pk,
                run_id=first.run_id,
                attempt=first.attempt + 1,
                client_reference=f"{first.client_reference}-{tag}",
                provider_profile=first.provider_profile,
                state=state,
                created_at=utcnow(),
            )
        )


@pytest.mark.parametrize("open_state", ["intent", "accepted", "unknown"])
def test_an_item_never_has_two_submissions_open(
    episode: Episode, tmp_path: Path, open_state: str
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    episode.generate()
    _second_submission(episode.engine, "failed", "f")  # closed calls beside it: any number
    _second_submission(episode.engine, "succeeded", "s")
    with episode.engine.begin() as conn:  # the paid call is in flight again
        accept = update(SubmissionRow).where(SubmissionRow.attempt == 1)
        conn.execute(accept.values(state="accepted"))
    for state in ("intent", "accepted", "unknown"):
        with pytest.raises(IntegrityError, match=ONE_OPEN):
            _second_submission(episode.engine, state)
    with episode.engine.begin() as conn:  # settled: a new call may be opened
        settle = update(SubmissionRow).where(SubmissionRow.attempt == 1)
        conn.execute(settle.values(state="failed"))
    with episode.engine.begin() as conn:
        conn.execute(text("DELETE FROM submissions WHERE client_reference LIKE '%-second'"))
    _second_submission(episode.engine, open_state)


def _submissions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(SubmissionRow)).scalar_one())


def test_a_claim_that_misses_the_open_submission_is_stopped_by_the_schema(
    episode: Episode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch mutation of the claim's Python guard ("is a paid call of this item open?"
    answers no): the claim would commit a second intent for an item whose call's acceptance
    is unknown, and so pay for it twice. The partial unique index refuses the intent; the
    provider is never called again."""
    episode.plan(write_playlist(tmp_path / "p", ["lost [[LOSE_RESPONSE]] [[NO_LOOKUP]]"]))
    first = episode.generate()
    assert first.exit_code == ExitCode.RUN_FAILED  # its acceptance unknown: never resubmitted
    assert sum(jobs_per_key().values()) == 1
    broken = DriverSQL(claims._OPEN_SUB.sqlite.replace("WHERE ", "WHERE 1 = 0 AND ", 1))
    monkeypatch.setattr(claims, "_OPEN_SUB", broken)
    with pytest.raises(IntegrityError, match=ONE_OPEN):
        episode.resume(first.run_id)
    assert sum(jobs_per_key().values()) == 1  # the provider made one job, as before
    assert _submissions(episode.engine) == 1


def test_a_claim_that_misses_a_live_lease_is_stopped_by_its_guard(
    episode: Episode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch mutation of the claim's other Python guard ("does another owner hold a live
    lease?" answers no): `TAKE_ITEM`'s WHERE refuses to move the item, the claim raises and
    its transaction (the intent with it) rolls back; the holder keeps the item."""
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    first = episode.generate()
    with episode.engine.begin() as conn:  # another worker holds it, its lease live
        conn.execute(
            update(ItemRow).values(
                state="running",
                claim_owner="other-host:1:x",
                claim_run_id=first.run_id,
                lease_expires_at=utcnow() + timedelta(minutes=10),
            )
        )
        conn.execute(update(SubmissionRow).values(state="failed"))
    jobs = sum(jobs_per_key().values())
    monkeypatch.setattr(claims, "claim_live", lambda *_: False)
    with pytest.raises(InvalidTransition, match="its guard refused the move"):
        episode.generate()
    assert sum(jobs_per_key().values()) == jobs  # nothing paid
    assert _submissions(episode.engine) == 1
    with episode.engine.connect() as conn:
        owner = conn.execute(select(ItemRow.claim_owner)).scalar_one()
    assert owner == "other-host:1:x"


# ---------------------------------------------------------------- the upgrade refuses, whole
def _ledger_at_0017(engine: Engine, tmp_path: Path) -> None:
    """A ledger made by the code of revision 0017: one paid episode, then the schema taken
    back to 0017 (the rows stay)."""
    from episodic.storage.schema import downgrade

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    episode.generate()
    downgrade(engine, "0017")
    assert current_revision(engine) == "0017"


def _states(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            (table, str(state))
            for table in TABLES.values()
            for state in conn.execute(text(f"SELECT state FROM {table} ORDER BY id")).scalars()
        ]


def test_the_upgrade_refuses_rows_outside_their_machines_naming_them_and_changes_nothing(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    _ledger_at_0017(engine, tmp_path)
    with engine.begin() as conn:  # what 0017 let through: a free string and a doubled call
        conn.execute(text("UPDATE items SET state = 'bogus' WHERE position = 1"))
        conn.execute(text("UPDATE runs SET state = 'halfway'"))
        conn.execute(text("UPDATE submissions SET state = 'accepted'"))
        item = conn.execute(text("SELECT MIN(item_pk) FROM submissions")).scalar_one()
        conn.execute(text("UPDATE submissions SET item_pk = :item"), {"item": item})
    before = _states(engine)
    with pytest.raises(MigrationRefused) as refused:
        upgrade(engine)
    message = str(refused.value)
    assert "\n" not in message and "nothing changed" in message
    assert "1 items in no state of their machine: id " in message and "'bogus'" in message
    assert "1 runs in no state of their machine" in message and "'halfway'" in message
    assert f"1 items with more than one open submission: item {item} (2026-W32-0 v01" in message
    assert ": 2 open)" in message and "close all but one open submission" in message
    assert current_revision(engine) == "0017" and _states(engine) == before
    with engine.begin() as conn:  # mended: the upgrade goes through
        conn.execute(text("UPDATE items SET state = 'failed' WHERE state = 'bogus'"))
        conn.execute(text("UPDATE runs SET state = 'failed'"))
        first = conn.execute(text("SELECT MIN(id) FROM submissions")).scalar_one()
        conn.execute(text("UPDATE submissions SET state = 'unknown' WHERE id = :f"), {"f": first})
        conn.execute(text("UPDATE submissions SET state = 'failed' WHERE state <> 'unknown'"))
    upgrade(engine)
    assert current_revision(engine) == "0018"


def test_db_upgrade_says_the_refusal_in_one_line_and_exits_2(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    _ledger_at_0017(engine, tmp_path)
    with engine.begin() as conn:
        conn.execute(text("UPDATE episodes SET state = 'approved?'"))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "episodic"), "db", "upgrade"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EPISODIC_DATABASE_URL": database_url},
    )
    assert done.returncode == ExitCode.REFUSED, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "episodes in no state of their machine" in lines[0] and "'approved?'" in lines[0]
    assert current_revision(engine) == "0017"
