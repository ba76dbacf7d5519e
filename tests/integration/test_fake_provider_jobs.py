"""The fake provider stands in for a remote one: its job store is one for every machine
(``EPISODIC_FAKE_PROVIDER_DIR``), and a job it does not know is never read as "failed, no
charge, buy again".

On SQLite and Postgres; money counted at the provider's side (the job files of the fake's
store: one per job it made, even when a kill -9 cut its log short).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.exit_codes import ExitCode
from tests.generation import (
    Episode,
    image_keys,
    made_jobs_per_key,
    new_episode,
    provider_log,
    write_playlist,
)

PRICE = 40_000  # the builtin fake profile's 0.04 per image, in micro-units


@pytest.fixture(autouse=True)
def shared_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The provider's side, outside every machine's state folder."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    jobs = tmp_path / "provider-jobs"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_DIR", str(jobs))
    return jobs


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql)).all()]


def _ledger_cost(engine: Engine) -> int:
    ((total,),) = _rows(engine, "SELECT coalesce(sum(amount_micros), 0) FROM cost_entries")
    return int(str(total))


def test_a_job_the_provider_does_not_know_stays_accepted_and_is_never_bought_again(
    engine: Engine, tmp_path: Path, shared_provider: Path
) -> None:
    """Accepted jobs, then a provider that answers "unknown job" (the store this machine
    sees does not hold them): the submissions stay accepted with a reason naming the job,
    nothing is charged 0 nor bought again; once the store is back, one collect completes."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a [[DELAY_MS:1500]]", "b [[DELAY_MS:1500]]"]))
    # --max-images, no money limit: both calls go at once (under a money limit the first call
    # of a price never billed is collected before the next is made, `episodic.storage.budgets`)
    first = episode.generate(collect_timeout_s=0.2, max_images=2)  # accepted, not ready yet
    assert first.counts.completed == 0
    assert sorted(made_jobs_per_key().values()) == [1, 1]
    elsewhere = tmp_path / "another-machines-store"
    shutil.move(shared_provider, elsewhere)  # this machine no longer sees those jobs

    second = episode.generate(collect_timeout_s=5)

    assert second.counts.completed == 0 and second.counts.paid_submissions == 0
    rows = _rows(engine, "SELECT state, remote_ref, error_text FROM submissions ORDER BY id")
    assert [state for state, _ref, _why in rows] == ["accepted", "accepted"]
    items = _rows(engine, "SELECT state, error_text FROM items ORDER BY id")
    for (_state, ref, _why), (_item_state, why) in zip(rows, items, strict=True):
        assert "remote job failed" not in str(why) and f"job '{ref}'" in str(why), why
        assert "not collected yet" in str(why) and "EPISODIC_FAKE_PROVIDER_DIR" in str(why)
    assert _ledger_cost(engine) == 0 and made_jobs_per_key() == {}  # nothing bought again
    assert len(_rows(engine, "SELECT id FROM submissions")) == 2

    shared_provider.rmdir()  # empty: the fake made no job meanwhile
    shutil.move(elsewhere, shared_provider)
    third = episode.resume(second.run_id, collect_timeout_s=30)  # as its line says
    assert third.exit_code == ExitCode.OK, third
    assert sorted(made_jobs_per_key().values()) == [1, 1]  # one job per image, ever
    assert _ledger_cost(engine) == 2 * PRICE and len(image_keys(engine)) == 2


def _machine_env(home: Path) -> dict[str, str]:
    return {**os.environ, "EPISODIC_HOME": str(home)}


def test_two_machines_on_one_database_share_the_fake_provider_and_take_over_a_killed_run(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_provider: Path
) -> None:
    """Machine A (its own EPISODIC_HOME) generates and is killed with kill -9 while its jobs
    run at the provider; after its leases expired, machine B (another EPISODIC_HOME, the
    same database, provider and media store, as two machines must share them: a machine
    on its own default store is refused, `test_store_identity`) takes the run over: one job
    per image, and the ledger's cost is the provider's bill."""
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    lease_s = 5
    shared_media = tmp_path / "shared-media"
    shared_media.mkdir()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(shared_media))
    monkeypatch.setenv("EPISODIC_LEASE_S", str(lease_s))
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "3000")
    items = 6
    episode: Episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(items)]))
    machine_a = subprocess.Popen(
        # --max-images: no money limit, so four jobs run at once (a price never billed is
        # otherwise probed with one call first, `episodic.storage.budgets`)
        [EPISODIC, "generate", episode.episode_id, "--concurrency", "4", "--max-images", "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_machine_env(tmp_path / "machine-a"),
    )
    deadline = time.monotonic() + 120
    while sum(e["event"] == "job_created" for e in provider_log()) < 4:  # running there
        assert machine_a.poll() is None, machine_a.communicate()
        assert time.monotonic() < deadline, "machine A made no progress"
        time.sleep(0.05)
    machine_a.send_signal(signal.SIGKILL)
    machine_a.communicate(timeout=60)
    assert _rows(engine, "SELECT count(*) FROM items WHERE state = 'completed'") == [(0,)]
    time.sleep(lease_s + 1)  # A's leases expire (a wait, not an assertion)

    taken = subprocess.run(
        [EPISODIC, "generate", episode.episode_id],
        capture_output=True,
        text=True,
        timeout=300,
        env=_machine_env(tmp_path / "machine-b"),
    )
    assert taken.returncode == 0, (taken.stdout, taken.stderr)

    made = made_jobs_per_key()
    assert len(made) == items and set(made.values()) == {1}  # one job per image
    bill = PRICE * sum(made.values())
    assert _ledger_cost(engine) == bill
    assert _rows(engine, "SELECT count(*) FROM items WHERE state = 'completed'") == [(items,)]
    assert _rows(engine, "SELECT count(*) FROM submissions WHERE state = 'failed'") == [(0,)]
    assert not (tmp_path / "machine-a" / "fake-provider").exists()  # the shared store only
    assert not (tmp_path / "machine-b" / "fake-provider").exists()
