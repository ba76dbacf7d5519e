"""Races between real OS processes released together by a barrier, on SQLite and Postgres.

Exactly-once is counted from the provider's side: the fake provider's own log of the jobs it
made and the create calls it received, never from our tables. SQLite's BEGIN IMMEDIATE
serializes writers; Postgres READ COMMITTED does not, which is where a check-then-write
claim would let two processes pay for one item.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from episodic.core.ids import WeekId
from episodic.core.runs import Refusal
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.allocation import allocate
from episodic.pipeline.check import check_episodes
from episodic.storage.models import ApprovalRow, EpisodeRow, ItemRow, SubmissionRow
from episodic.storage.runs import RunStore
from tests.generation import (
    Episode,
    admit,
    creates_per_key,
    jobs_per_key,
    new_episode,
    new_run,
    provider_log,
    write_playlist,
)
from tests.integration import race_workers as w

pytestmark = pytest.mark.slow
PROCESSES = 4
TRIALS = 25


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


def _running_run(episode: Episode) -> str:
    """A run that includes every planned item, moved to running (nothing claimed yet)."""

    run_id = new_run(episode)
    RunStore(episode.engine).transition_run(run_id, RunState.RUNNING)
    return run_id


def _runner(episode: Episode) -> Any:
    """The runner a `generate` of the episode would use, built in this process."""
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import build_runner, prepare

    settings = load_settings()
    return build_runner(
        episode.engine,
        settings,
        prepare(episode.engine, settings, "weekly", episode.episode_id, "generate"),
        EnvironmentCredentials(),
    )


def _claim_race(engine: Engine, database_url: str, run_id: str) -> list[list[object]]:
    with engine.connect() as conn:
        pks = conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars().all()
    home = str(load_settings().home_path)
    trials = [(pk, run_id) for pk in pks]
    answers = w.run_processes(
        [(w.claim_worker, (database_url, home, trials)) for _ in range(PROCESSES)]
    )
    return [row for answer in answers for row in answer]


def _locks_waited(engine: Engine) -> int:
    """Postgres sessions of the test database waiting for a lock (row or advisory)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
                    "AND wait_event_type = 'Lock'"
                ),
                {"d": engine.url.database},
            ).scalar_one()
        )


def _until_waiting(engine: Engine, count: int, done: Any = None) -> None:
    """Until `count` sessions wait for a lock (or `done`, an Event, is set; at most 20 s)."""
    deadline = time.monotonic() + 20
    while _locks_waited(engine) < count and time.monotonic() < deadline:
        if done is not None and done.is_set():
            return
        time.sleep(0.02)


def _release(blocker: Any, threads: list[Any], outcomes: dict[str, object]) -> None:
    """End the third session's transaction, let the threads finish, and check none raised."""
    blocker.commit()
    blocker.close()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(isinstance(o, Exception) for o in outcomes.values()), outcomes


def _item_states(engine: Engine, run_id: object) -> list[str]:
    """The states of the run's items, sorted."""
    from episodic.storage.models import RunItemRow

    with engine.connect() as conn:
        return sorted(
            conn.execute(
                select(ItemRow.state)
                .join(RunItemRow, RunItemRow.item_pk == ItemRow.id)
                .where(RunItemRow.run_id == run_id)
            ).scalars()
        )


def test_one_pending_item_is_claimed_and_paid_once(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(TRIALS)]))
    run_id = _running_run(episode)
    rows = _claim_race(engine, database_url, run_id)
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    per_item = Counter(r[0] for r in rows if r[1] == "submit")
    assert len(per_item) == TRIALS and set(per_item.values()) == {1}  # one winner per trial
    assert Counter(r[1] for r in rows)["busy"] == TRIALS * (PROCESSES - 1)
    assert len(jobs_per_key()) == TRIALS and set(jobs_per_key().values()) == {1}
    assert set(creates_per_key().values()) == {1}


def test_a_failed_item_is_retried_by_one_process_only(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(TRIALS)]))
    run_id = _running_run(episode)
    with engine.begin() as conn:  # every item failed once before, nothing open: a retry is due
        conn.execute(update(ItemRow).values(state="failed", attempts=1))
    rows = _claim_race(engine, database_url, run_id)
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    per_item = Counter(r[0] for r in rows if r[1] == "submit")
    assert len(per_item) == TRIALS and set(per_item.values()) == {1}
    with engine.connect() as conn:
        assert set(conn.execute(select(ItemRow.attempts)).scalars()) == {2}
        refs = conn.execute(select(SubmissionRow.client_reference)).scalars().all()
    assert len(refs) == TRIALS and all(ref.endswith("-2") for ref in refs)
    assert set(creates_per_key().values()) == {1}


def _episodes(engine: Engine, tmp_path: Path, count: int, videos: int) -> list[Episode]:
    episodes = []
    for n in range(count):
        allocation = allocate(engine, "weekly", WeekId.parse("2026-W32"), f"race:{n}")
        episode = Episode(engine, str(allocation.episode.episode_id))
        episode.plan(write_playlist(tmp_path / f"p{n}", [f"e{n} v{k}" for k in range(videos)]))
        episodes.append(episode)
    return episodes


def _assert_paid_once_and_clean(engine: Engine, episodes: list[Episode], videos: int) -> None:
    jobs = jobs_per_key()
    assert len(jobs) == len(episodes) * videos, "an item was never paid for"
    assert set(jobs.values()) == {1}, f"paid twice: {[k for k, v in jobs.items() if v > 1]}"
    assert set(creates_per_key().values()) == {1}
    with engine.connect() as conn:
        states = Counter(conn.execute(select(ItemRow.state)).scalars())
        episode_states = Counter(conn.execute(select(EpisodeRow.state)).scalars())
    assert states == {"completed": len(episodes) * videos}
    assert episode_states == {"generated": len(episodes)}
    assert check_episodes(engine, "weekly") == []


@pytest.mark.parametrize("delay_ms", [0, 20])
def test_whole_generate_runs_of_one_episode_pay_each_item_once(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    delay_ms: int,
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", str(delay_ms))
    videos, trials = 6, 8
    episodes = _episodes(engine, tmp_path, trials, videos)
    ids = [e.episode_id for e in episodes]
    answers = w.run_processes(
        [(w.generate_worker, (database_url, ids, "generate")) for _ in range(3)]
    )
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    assert {(r[1], r[2]) for r in rows} == {("completed", 0)}  # every caller: completed, exit 0
    _assert_paid_once_and_clean(engine, episodes, videos)


def test_resume_racing_a_new_generate_pays_each_item_once(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "10")
    videos, trials = 6, 6
    episodes = _episodes(engine, tmp_path, trials, videos)
    targets = []
    for episode in episodes:  # a paused run per episode, nothing paid yet
        run_id = _running_run(episode)
        RunStore(engine).transition_run(run_id, RunState.PAUSED, "interrupted")
        targets.append(f"{episode.episode_id}:{run_id}")
    answers = w.run_processes(
        [
            (w.generate_worker, (database_url, targets, "resume")),
            (w.generate_worker, (database_url, targets, "generate")),
            (w.generate_worker, (database_url, targets, "generate")),
        ]
    )
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    assert {(r[1], r[2]) for r in rows} == {("completed", 0)}
    _assert_paid_once_and_clean(engine, episodes, videos)


def test_cancel_stops_a_running_run_within_one_item(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "100")
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(40)]))
    run_id = _running_run(episode)
    RunStore(engine).transition_run(run_id, RunState.PAUSED, "ready")
    answers = w.run_processes(
        [
            (w.run_worker, (database_url, episode.episode_id, run_id)),
            (w.cancel_worker, (database_url, run_id, 0.6)),
        ]
    )
    by_kind = {a[0]: a for a in answers}
    assert by_kind["cancel"][1] == "ok"
    assert by_kind["run"][1] == "cancelled" and by_kind["run"][2] == 130, by_kind["run"]
    cancelled_at = float(by_kind["cancel"][3])
    created = [e for e in provider_log() if e["event"] == "job_created"]
    late = [e for e in created if e["at"] > cancelled_at]
    assert 0 < len(created) < 40
    assert len(late) <= 4, f"{len(late)} paid calls after the cancel (concurrency is 4)"
    assert set(jobs_per_key().values()) == {1}
    assert RunStore(engine).run_state(run_id) == "cancelled"
    with engine.connect() as conn:
        assert (
            conn.execute(
                select(func.count()).select_from(ItemRow).where(ItemRow.state == "running")
            ).scalar_one()
            == 0
        )
    # Nothing is left as "unknown" by the stop: the next generate finishes the episode, and
    # every item has exactly one provider job.
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "0")
    assert episode.generate().exit_code == 0
    assert len(jobs_per_key()) == 40 and set(jobs_per_key().values()) == {1}
    assert check_episodes(engine, "weekly") == []


def test_approve_and_reject_at_the_same_moment_record_one_decision(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    trials = 10
    episodes = _episodes(engine, tmp_path, trials, 1)
    for episode in episodes:
        episode.generate()
    ids = [e.episode_id for e in episodes]
    answers = w.run_processes(
        [
            (w.decide_worker, (database_url, ids, True)),
            (w.decide_worker, (database_url, ids, False)),
        ]
    )
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    per_episode: dict[str, list[str]] = {}
    for episode_id, result in rows:
        per_episode.setdefault(episode_id, []).append(result)
    assert all(sorted(v) == ["recorded", "refused"] for v in per_episode.values()), per_episode
    with engine.connect() as conn:
        decisions = Counter(conn.execute(select(ApprovalRow.episode_pk)).scalars())
        states = Counter(conn.execute(select(EpisodeRow.state)).scalars())
    assert len(decisions) == trials and set(decisions.values()) == {1}
    assert sum(states.values()) == trials and set(states) <= {"approved", "rejected"}


def test_a_run_concluded_failed_elsewhere_is_finished_by_the_process_still_working_on_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stale process (frozen past its lease, then woken) concludes the shared run "failed"
    # from the items it saw, while the recovery run still works on it. The process still
    # working reopens the run and finishes it: completed, exit 0, each item paid once.
    import threading

    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "700")
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    run_id = new_run(episode)
    outcomes: list[object] = []
    worker = threading.Thread(
        target=lambda: outcomes.append(episode.resume(run_id, concurrency=1, lease_s=1.5))
    )
    worker.start()
    store = RunStore(engine)
    deadline = time.monotonic() + 30
    while store.run_state(run_id) != "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the first item is in flight
    store.transition_run(run_id, RunState.FAILED, "1 items failed")  # the stale one's finish
    worker.join(timeout=60)
    (outcome,) = outcomes
    assert outcome.exit_code == 0 and outcome.state == "completed", outcome.message  # type: ignore[attr-defined]
    assert store.run_state(run_id) == "completed"
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 3
    assert check_episodes(engine, "weekly") == []


def test_a_process_stopped_by_another_does_not_pause_a_run_resumed_elsewhere(
    engine: Engine, tmp_path: Path
) -> None:
    # The stop came from the run's state (paused elsewhere, then resumed by another
    # process), not from an interrupt of this process: the run is left running there.
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    run_id = _running_run(episode)
    run = _runner(episode)
    outcome = run._stopped(run_id, "stale-owner", 0, (), interrupted=False)
    assert RunStore(engine).run_state(run_id) == "running"
    assert outcome.exit_code == 130 and "goes on in another process" in outcome.message
    run._stopped(run_id, "stale-owner", 0, (), interrupted=True)  # a real Ctrl-C pauses it
    assert RunStore(engine).run_state(run_id) == "paused"


def test_a_run_is_not_concluded_while_another_process_holds_one_of_its_items(
    engine: Engine, tmp_path: Path
) -> None:
    # This process is done with its items, but another one has just claimed one of them
    # (a retry of an item that failed here). The run is followed until that claim ends,
    # instead of being concluded under the other process's feet.
    import threading

    from episodic.core.planning import RunOptions
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["fine", "doomed [[FAIL_PERMANENT]]"]))
    run_id = _running_run(episode)
    run = _runner(episode)
    claims = ClaimStore(engine)
    leases = LeaseStore(engine)
    released_at: list[float] = []

    def another_process_retries(item: object, result: str) -> None:
        if result != "failed":
            return
        held = claims.claim(
            item.pk,  # type: ignore[attr-defined]
            run_id,
            "another-process",
            lease_s=30,
            max_attempts=5,
            profile="fake",
        )
        assert not isinstance(held, type(None)) and hasattr(held, "token"), held

        def give_up_later() -> None:
            time.sleep(1.0)
            released_at.append(time.monotonic())
            leases.release(held, "failed again")  # type: ignore[arg-type]

        threading.Thread(target=give_up_later).start()

    run.on_progress = another_process_retries
    outcome = run.execute(run_id, RunOptions(concurrency=1, lease_s=10))
    finished_at = time.monotonic()
    assert released_at and finished_at >= released_at[0]  # it waited for the other claim
    assert outcome.counts.running == 0 and outcome.counts.failed == 1
    assert outcome.exit_code == 6 and "1 item failed" in outcome.message


SLOTS: dict[str, Any] = {"lease_s": 1, "max_attempts": 3, "profile": "fake", "provider_limit": 8}


def _two_holders(engine: Engine, tmp_path: Path) -> tuple[Episode, str, Any, Any, Any]:
    """A one-item episode's running run and two engines (holders A and B) in this process."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one"]))
    run_id = _running_run(episode)
    (item,) = RunStore(engine).run_items(run_id)
    return episode, run_id, item, _runner(episode), _runner(episode)


def test_a_holder_woken_after_a_takeover_never_withdraws_the_intent_the_new_holder_sent(
    engine: Engine, tmp_path: Path
) -> None:
    """Holder A claims an item and freezes past its lease; holder B takes the item over and
    reconciles A's intent by resending the same create (the provider makes the job); A wakes
    before B records the acceptance and, its claim lost, withdraws "its" unsent intent,
    which would delete the row of a job that exists (the next run paying a second job). A
    withdraw is only the holder's; B records the job, and nothing is paid twice.
    Counted in the fake provider's own log."""
    from episodic.core.planning import RunOptions
    from episodic.storage.claims import ClaimStore

    episode, run_id, item, a, b = _two_holders(engine, tmp_path)
    slots = SLOTS
    held_by_a = ClaimStore(engine).claim(item.pk, run_id, "owner-A", **slots)
    time.sleep(1.3)  # A is frozen: its lease runs out
    held_by_b = ClaimStore(engine).claim(item.pk, run_id, "owner-B", **slots)
    assert held_by_b.action == "reconcile"  # type: ignore[union-attr]
    options = RunOptions(lease_s=1)
    send = b.provider.submit
    woken: list[str] = []

    def b_sends_then_a_wakes(request: Any) -> str:
        remote_ref = send(request)  # the job exists at the provider now
        woken.append(a.process(held_by_a, options))  # A goes on with its lost claim
        return str(remote_ref)

    b.provider.submit = b_sends_then_a_wakes
    assert b.process(held_by_b, options) == "completed"
    assert woken == ["interrupted"]
    again = episode.generate()
    assert again.state.value == "completed", again.message
    assert jobs_per_key() == Counter({item.idempotency_key: 1}), provider_log()
    assert check_episodes(engine, "weekly") == []


def test_a_holder_refused_after_a_takeover_never_fails_the_job_the_new_holder_sent(
    engine: Engine, tmp_path: Path
) -> None:
    """Holder A sends its intent and freezes past its lease before the reply; holder B takes
    the item over and reconciles by resending the same create: the provider makes the job and
    B records the acceptance (its collect is left for later). A's reply then arrives: a
    refusal. A closed the submission failed, accepted or not, so the next run paid a second
    job. A refusal (and an operator's abandon) now closes only the holder's own unsettled
    submission; the next run collects B's job. Counted in the fake provider's own log."""
    from episodic.core.planning import RunOptions
    from episodic.providers.base import CollectionPending, PermanentProviderError
    from episodic.storage.claims import ClaimStore

    episode, run_id, item, a, b = _two_holders(engine, tmp_path)
    slots = SLOTS
    held_by_a = ClaimStore(engine).claim(item.pk, run_id, "owner-A", **slots)
    assert held_by_a.action == "submit"  # type: ignore[union-attr]
    options = RunOptions(lease_s=1)
    taken_over: list[str] = []

    def collect_later(*args: Any, **kwargs: Any) -> Any:
        raise CollectionPending("still running")

    def a_freezes_then_is_refused(request: Any) -> str:
        time.sleep(1.3)  # A is frozen past its lease while its call is out
        held_by_b = ClaimStore(engine).claim(item.pk, run_id, "owner-B", **slots)
        assert held_by_b.action == "reconcile"  # type: ignore[union-attr]
        taken_over.append(b.process(held_by_b, options))  # B resends: the job exists
        raise PermanentProviderError("400 refused")

    a.provider.submit = a_freezes_then_is_refused
    b.provider.collect = collect_later
    assert a.process(held_by_a, options) == "failed"
    assert taken_over == ["collect later"]
    (state,) = engine.connect().execute(
        select(SubmissionRow.state).where(SubmissionRow.item_pk == item.pk)
    )
    assert state.state == "accepted"
    again = episode.generate()
    assert again.state.value == "completed", again.message
    assert jobs_per_key() == Counter({item.idempotency_key: 1}), provider_log()
    assert check_episodes(engine, "weekly") == []


def test_a_run_paused_by_another_process_after_this_one_finished_its_items_completes(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes on one run; the other one is interrupted (it pauses the run) just after
    this one finished the last item. This one got no signal and every item is done, so it
    does not conclude "interrupted and paused" (exit 130): the process that finished the
    work completes the run."""
    from episodic.pipeline.runner import Runner

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    real_finish = Runner.finish

    def paused_elsewhere_first(self: Runner, run_id: str, *args: Any, **kwargs: Any) -> Any:
        RunStore(self.store.engine).transition_run(run_id, RunState.PAUSED, "interrupted")
        return real_finish(self, run_id, *args, **kwargs)

    monkeypatch.setattr(Runner, "finish", paused_elsewhere_first)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one", "two"]))
    outcome = episode.generate(concurrency=2)
    assert outcome.state == RunState.COMPLETED, outcome.message
    assert int(outcome.exit_code) == 0
    assert check_episodes(engine, "weekly") == []


def test_an_item_another_process_left_unsettled_when_interrupted_is_settled_here(
    engine: Engine, tmp_path: Path
) -> None:
    """Two processes on one run. The other one sent an item's job, lost the reply, and was
    interrupted while it looked the job up: it released the item with its acceptance unknown.
    This process, which followed the item, settles it by a lookup at no cost and completes the
    run (a guard written while hunting an exit 6 of a process that got no signal in the fault
    suite; this case already held). The provider's own log shows one job per item."""
    import threading

    from episodic.core.planning import RunOptions
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.ledger import LedgerStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one", "two"]))
    run_id = _running_run(episode)
    here, other = _runner(episode), _runner(episode)
    claims = ClaimStore(engine)
    ledger = LedgerStore(engine)
    leases = LeaseStore(engine)
    two = RunStore(engine).run_items(run_id)[1]
    held = claims.claim(two.pk, run_id, "another-process", **{**SLOTS, "lease_s": 30})
    assert held.action == "submit" and held.submission is not None  # type: ignore[union-attr]

    def sends_then_is_interrupted_while_looking() -> None:
        time.sleep(0.8)
        other.provider.submit(other.paid.request(held, held.submission))  # type: ignore[arg-type,union-attr]
        ledger.mark_unknown(held.submission.pk, "reply lost")  # type: ignore[union-attr]
        leases.release(held, "acceptance unknown (reply lost); not resubmitted")  # type: ignore[arg-type]

    threading.Thread(target=sends_then_is_interrupted_while_looking).start()
    outcome = here.execute(run_id, RunOptions(concurrency=2, lease_s=10))
    assert outcome.state == RunState.COMPLETED, outcome.message
    assert int(outcome.exit_code) == 0
    items = RunStore(engine).run_items(run_id)
    assert jobs_per_key() == Counter({it.idempotency_key: 1 for it in items}), provider_log()
    assert check_episodes(engine, "weekly") == []


def test_an_own_item_whose_retry_found_the_run_paused_by_another_process_is_finished_here(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes on one run. This one's item failed its first submit transiently and
    waited to send it again; meanwhile the other process was interrupted and paused the run.
    The retry's claim check then fails and the item is given up as interrupted; this
    process, never signalled, must not conclude the run failed (exit 6) with nobody taking
    it back: the items this process gave up itself are taken back too; the provider's own
    log shows one job per item."""
    from episodic.providers.base import TransientProviderError
    from episodic.providers.fake import FakeProvider

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    real_submit = FakeProvider.submit
    paused: list[str] = []

    def paused_during_the_backoff(self: FakeProvider, request: Any) -> str:
        try:
            return real_submit(self, request)
        except TransientProviderError:
            if not paused:  # the other process's interrupt lands now
                (run,) = RunStore(engine).list_runs("weekly", episode.episode_id)
                RunStore(engine).transition_run(run.run_id, RunState.PAUSED, "interrupted")
                paused.append(run.run_id)
            raise

    monkeypatch.setattr(FakeProvider, "submit", paused_during_the_backoff)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one [[FAIL_TRANSIENT:1]]", "two"]))
    outcome = episode.generate(concurrency=1)
    assert paused, "the run was never paused"
    assert outcome.state == RunState.COMPLETED, outcome.message
    assert int(outcome.exit_code) == 0
    items = RunStore(engine).run_items(outcome.run_id)
    assert jobs_per_key() == Counter({it.idempotency_key: 1 for it in items}), provider_log()
    assert check_episodes(engine, "weekly") == []


def test_an_interrupt_whose_keyboardinterrupt_was_swallowed_still_stops_the_paying(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT or SIGTERM whose KeyboardInterrupt Python swallows (raised inside a weakref
    callback: "Exception ignored ...", as at start-up) must not leave `generate` running and
    paying. The handler also tells the run's engine directly: the run
    stops before its next paid call, is paused, and the command says so (exit 130). Here
    the handler's telling happens without the raise, as when it is swallowed."""
    import episodic.cli.app as cli_app
    from episodic.cli.signals import interrupts
    from episodic.providers.fake import FakeProvider

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    real_submit = FakeProvider.submit

    def signalled_at_the_first_call(self: FakeProvider, request: Any) -> str:
        if not interrupts.signalled.is_set():
            interrupts.tell_listeners()  # the handler ran; its KeyboardInterrupt was lost
        return real_submit(self, request)

    monkeypatch.setattr(FakeProvider, "submit", signalled_at_the_first_call)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", [f"item {n}" for n in range(6)]))
    try:
        code = cli_app.run(["generate", episode.episode_id, "--concurrency", "1", "--json"])
    finally:
        interrupts.signalled.clear()
    assert code == 130
    (run,) = RunStore(engine).list_runs("weekly", episode.episode_id)
    assert run.state == RunState.PAUSED
    assert sum(jobs_per_key().values()) == 1  # the call in flight; nothing after the signal


def test_a_dispatchers_claim_of_several_items_is_one_transaction(
    engine: Engine, tmp_path: Path
) -> None:
    """One write fills every free slot, on Postgres too (it took one transaction per item
    there: 32 in a row for a wave of 32, bench/batch.py)."""
    from sqlalchemy import event

    from episodic.pipeline.runner import new_owner
    from episodic.storage.claims import ClaimStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(8)]))
    run_id = _running_run(episode)
    with engine.connect() as conn:
        pks = conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars().all()
    commits: list[object] = []

    def committed(conn: object) -> None:
        commits.append(conn)

    event.listen(engine, "commit", committed)
    answers = ClaimStore(engine).claim_many(
        [(pk, True) for pk in reversed(pks)],
        run_id,
        new_owner(),
        lease_s=60,
        max_attempts=3,
        profile="fake",
        provider_limit=8,
    )
    event.remove(engine, "commit", committed)
    assert [getattr(a, "action", a) for a in answers] == ["submit"] * 8
    assert [a.item.pk for a in answers] == list(reversed(pks))  # type: ignore[union-attr]
    assert len(commits) == 1


def test_batched_claims_never_deadlock_with_each_other_or_a_heartbeat(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """Dispatchers claiming overlapping batches in opposite orders while the holder's
    heartbeat renews them, released together: every statement that locks several items
    takes them in one order, so none is aborted as a deadlock (Postgres READ COMMITTED;
    SQLite's writer lock serializes them anyway)."""
    from episodic.pipeline.runner import new_owner
    from episodic.storage.claims import ClaimStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(24)]))
    run_id = _running_run(episode)
    with engine.connect() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())
    owner, other = new_owner(), new_owner()
    first = ClaimStore(engine).claim_many(
        [(pk, True) for pk in pks], run_id, owner, lease_s=60, max_attempts=3, profile="fake"
    )
    assert all(getattr(a, "action", None) == "submit" for a in first)
    rounds = 15
    errors = w.run_processes(
        [
            (w.lock_order_worker, (database_url, run_id, owner, "claim", pks[::-1], rounds)),
            (w.lock_order_worker, (database_url, run_id, owner, "claim", pks, rounds)),
            (w.lock_order_worker, (database_url, run_id, other, "claim", pks[::-1], rounds)),
            (w.lock_order_worker, (database_url, run_id, owner, "renew", [], rounds * 4)),
        ]
    )
    assert [e for worker in errors for e in worker] == []
    with engine.connect() as conn:  # still the holder's, each with its one intent
        held = conn.execute(select(ItemRow.state, ItemRow.claim_owner)).all()
        intents = conn.execute(select(func.count()).select_from(SubmissionRow)).scalar_one()
    assert set(held) == {("running", owner)} and intents == len(pks)


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_batch_claim_of_a_replanned_run_never_deadlocks_with_its_cancel(
    engine: Engine, tmp_path: Path
) -> None:
    """A dispatcher's batch reaching a re-planned run while an operator cancels it: the
    cancel locks the run's row, then its pending items; the claim decides the run before it
    locks any item, so one waits for the other and both finish (a claim that locked its
    items first and then cancelled the re-planned run would deadlock with the cancel). The
    order of the locks is forced with a third session."""
    import threading

    from sqlalchemy import text

    from episodic.pipeline.runner import new_owner
    from episodic.storage.claims import ClaimStore
    from episodic.storage.models import EpisodePlanRow, RunRow

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(8)]))
    run_id = _running_run(episode)
    with engine.begin() as conn:  # the run was admitted for this plan, as `generate` does
        latest = select(func.max(EpisodePlanRow.id)).scalar_subquery()
        conn.execute(update(RunRow).where(RunRow.id == run_id).values(plan_id=latest))
    episode.plan(write_playlist(tmp_path / "p2", [f"t{n}" for n in range(7)] + ["changed"]))
    with engine.connect() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())

    outcomes: dict[str, object] = {}
    finished = {name: threading.Event() for name in ("cancel", "claim")}

    def cancel() -> None:
        try:
            outcomes["cancel"] = RunStore(engine).transition_run(run_id, RunState.CANCELLED)
        except Exception as exc:
            outcomes["cancel"] = exc
        finished["cancel"].set()

    def claim() -> None:
        try:
            outcomes["claim"] = ClaimStore(engine).claim_many(
                [(pk, True) for pk in pks[4:6]],
                run_id,
                new_owner(),
                lease_s=30,
                max_attempts=3,
                profile="fake",
                provider_limit=6,
            )
        except Exception as exc:
            outcomes["claim"] = exc
        finished["claim"].set()

    blocker = engine.connect()
    blocker.begin()
    blocker.execute(text("SELECT 1 FROM items WHERE id = :i FOR UPDATE"), {"i": pks[3]})
    threads = [threading.Thread(target=cancel), threading.Thread(target=claim)]
    threads[0].start()
    _until_waiting(
        engine, 1, finished["cancel"]
    )  # the cancel holds the run and waits at the fourth item
    threads[1].start()
    _until_waiting(
        engine, 2, finished["claim"]
    )  # the claim waits too (for the run's row, or an item)
    blocker.commit()
    blocker.close()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(isinstance(o, Exception) for o in outcomes.values()), outcomes
    assert outcomes["cancel"] is True
    answers = outcomes["claim"]
    assert isinstance(answers, list)
    assert [a.reason for a in answers if isinstance(a, Refusal)] == ["stopped", "stopped"]
    assert RunStore(engine).run_state(run_id) == RunState.CANCELLED


def _jobs_left_accepted(
    engine: Engine, tmp_path: Path, titles: list[str]
) -> tuple[Episode, str, list[str]]:
    """Run A's accepted jobs, one per item of a playlist of `titles`, their holder gone (the
    jobs stay accepted): (episode, A, the jobs in item order)."""
    from episodic.pipeline.runner import new_owner
    from episodic.providers.base import ImageRequest
    from episodic.providers.fake import FakeProvider
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.ledger import LedgerStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", titles))
    run_a = _running_run(episode)
    with engine.connect() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())
    claims = ClaimStore(engine)
    ledger = LedgerStore(engine)
    leases = LeaseStore(engine)
    provider = FakeProvider(
        profile_id="fake", state_dir=load_settings().home_path / "fake-provider"
    )
    remotes = []
    owner = new_owner()
    for pk in pks:
        claim = claims.claim(pk, run_a, owner, lease_s=30, max_attempts=3, profile="fake")
        assert not isinstance(claim, Refusal) and claim.submission is not None
        item = claim.item
        remotes.append(
            provider.submit(
                ImageRequest(
                    claim.submission.client_reference, "e", item.item_id, item.prompt, item.seed
                )
            )
        )
        assert ledger.accept(claim.submission.pk, remotes[-1])
        leases.release(claim, "interrupted")  # A's process stopped; its job stays accepted
    return episode, run_a, remotes


def _job_kept_open(engine: Engine, tmp_path: Path, title: str) -> tuple[Episode, str, str, str]:
    """Run A's accepted job for the episode's one item, its holder gone (the job stays
    accepted), and run B, live and including the item: (episode, A, the job, B)."""
    episode, run_a, (remote,) = _jobs_left_accepted(engine, tmp_path, [title])
    return episode, run_a, remote, new_run(episode)  # B: another live run includes the item


def test_cancelling_a_run_keeps_the_jobs_another_live_run_will_collect(
    engine: Engine, tmp_path: Path
) -> None:
    """Run A's accepted job for an item that run B also includes is not cancelled at the
    provider when A is cancelled: B collects it, and the item is paid once. (Cancelling it
    would make B pay a second job, and Replicate bills a cancelled one.) Counted from the
    fake provider's own log."""
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials

    episode, run_a, remote, run_b = _job_kept_open(engine, tmp_path, "only")
    state, jobs = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert state == "cancelled"
    assert not [e for e in provider_log() if e["event"] == "cancel"]
    assert [(j.remote_ref, j.kept_for, j.missed) for j in jobs] == [(remote, run_b, False)]
    outcome = episode.generate()
    assert outcome.counts.completed == 1, outcome.message
    assert set(jobs_per_key().values()) == {1} and set(creates_per_key().values()) == {1}
    assert [e["event"] for e in provider_log() if e["event"] == "collect"] == ["collect"]


def test_cancelling_the_run_a_job_was_kept_for_cancels_that_job(
    engine: Engine, tmp_path: Path
) -> None:
    """Run A's cancel keeps its accepted job for run B; cancelling B then asks the provider
    to cancel that job, although it was A's submission (a cancel looking only at B's own
    would leave it running and billed)."""
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials

    _episode, run_a, remote, run_b = _job_kept_open(engine, tmp_path, "only [[DELAY_MS:600000]]")
    _state, kept = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [j.kept_for for j in kept] == [run_b]
    state, jobs = cancel_run(engine, load_settings(), run_b, EnvironmentCredentials())
    assert state == "cancelled"
    assert [e["remote_ref"] for e in provider_log() if e["event"] == "cancel"] == [remote]
    assert [(j.remote_ref, j.kept_for, j.asked) for j in jobs] == [(remote, None, True)]


def test_a_job_kept_for_a_run_that_then_crashed_and_was_cancelled_again_is_bought_once_more(
    engine: Engine, tmp_path: Path
) -> None:
    """`runs cancel A` keeps A's job for run B; B's process dies and the sweep fails B; a
    second `runs cancel A` then cancels the job (no live run includes the item: a failed
    run is not live). `retry` resumes B, which must not collect the cancelled job and fail
    the item for the next retry to buy. The second cancel says "canceled"; the resumed run
    buys the item anew at once and completes,
    one job more at the provider, never two uncancelled ones."""
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials

    episode, run_a, remote, run_b = _job_kept_open(engine, tmp_path, "only [[DELAY_MS:4000]]")
    _state, kept = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [j.kept_for for j in kept] == [run_b]
    store = RunStore(engine)
    store.transition_run(run_b, RunState.RUNNING, lease_s=30)
    store.transition_run(run_b, RunState.FAILED, "holder died (swept)")
    _state, again = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [(j.remote_ref, j.answer, j.kept_for) for j in again] == [(remote, "canceled", None)]
    outcome = episode.resume(run_b)
    assert outcome.state.value == "completed" and outcome.counts.failed == 0, outcome.message
    assert list(jobs_per_key().values()) == [2]
    assert [e["remote_ref"] for e in provider_log() if e["event"] == "cancel"] == [remote]
    assert check_episodes(engine, "weekly") == []


@pytest.mark.parametrize(
    ("title", "limits", "answer"),
    [
        # the job failed at the provider on its own; the cancel only asked (too late)
        ("only [[DELAY_MS:300]] [[FAIL_REMOTE]]", {}, "succeeded"),
        ("only [[DELAY_MS:4000]]", {"max_retries": 0}, "canceled"),  # no attempt left
        ("only [[DELAY_MS:4000]]", {"max_cost_micros": 0}, "canceled"),  # over the budget
        ("only [[DELAY_MS:4000]]", {"max_images": 0}, "canceled"),
    ],
    ids=["failed-on-its-own", "max-retries", "max-cost", "max-images"],
)
def test_a_run_buys_a_cancelled_job_anew_only_if_cancelled_and_within_its_limits(
    engine: Engine, tmp_path: Path, title: str, limits: dict[str, int], answer: str
) -> None:
    """A run buys an item anew only when the provider says the job was cancelled, the
    cancel of another run asked for it, and --max-retries and the budget allow one more
    call. A job that failed on its own after a cancel had only asked (the provider answered
    `succeeded`) is not bought again by itself, nor past --max-retries, --max-cost and
    --max-images. Otherwise the item fails and
    the operator decides. Counted at the fake provider."""
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials

    episode, run_a, remote, run_b = _job_kept_open(engine, tmp_path, title)
    _state, kept = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [j.kept_for for j in kept] == [run_b]
    store = RunStore(engine)
    store.transition_run(run_b, RunState.RUNNING, lease_s=30)
    store.transition_run(run_b, RunState.FAILED, "holder died (swept)")
    if answer == "succeeded":
        time.sleep(0.5)  # the job has ended at the provider (failed) before the cancel asks
    _state, again = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [(j.remote_ref, j.answer) for j in again] == [(remote, answer)]
    outcome = episode.resume(run_b, **limits)
    assert outcome.state.value == "failed" and outcome.counts.failed == 1, outcome.message
    assert list(jobs_per_key().values()) == [1]  # nothing bought anew


def _cancel_admitting_b_in_the_first_call(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int
) -> tuple[Episode, list[str], str, list[Any]]:
    """`runs cancel A` over three accepted jobs of `delay_ms`, with run B admitted over the
    same items from inside the provider's first cancel call (after that job's decision,
    before the provider cancels it): (episode, the jobs, B, the cancel's answers)."""
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.providers.fake import FakeProvider

    titles = [f"t{n} [[DELAY_MS:{delay_ms}]]" for n in range(3)]
    episode, run_a, remotes = _jobs_left_accepted(engine, tmp_path, titles)
    real_cancel = FakeProvider.cancel
    admitted: list[str] = []

    def cancel_while_b_is_admitted(self: FakeProvider, remote_ref: str) -> str:
        if not admitted:
            admitted.append(new_run(episode))
        return real_cancel(self, remote_ref)

    monkeypatch.setattr(FakeProvider, "cancel", cancel_while_b_is_admitted)
    _state, jobs = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    monkeypatch.setattr(FakeProvider, "cancel", real_cancel)
    (run_b,) = admitted
    return episode, remotes, run_b, jobs


def test_a_run_admitted_while_a_cancel_asks_the_provider_keeps_the_jobs_not_yet_asked(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs cancel A` asks the provider job by job; run B, admitted over the same items
    while the first job's cancel is in flight, is collecting the others. Those are kept for
    B (a check made once, before the loop, would cancel all three: B's items failed and a
    resume buying them again). The moment is made exact by
    admitting B from inside the provider's first cancel call. Counted from the fake
    provider's own log."""
    _episode, remotes, run_b, jobs = _cancel_admitting_b_in_the_first_call(
        engine, tmp_path, monkeypatch, delay_ms=600000
    )
    assert [(j.remote_ref, j.kept_for) for j in jobs] == [
        (remotes[0], None),
        (remotes[1], run_b),
        (remotes[2], run_b),
    ]
    assert [e["remote_ref"] for e in provider_log() if e["event"] == "cancel"] == remotes[:1]


def test_a_run_admitted_after_a_cancel_decided_buys_the_cancelled_job_anew_not_failing_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B is admitted after `runs cancel A` decided to cancel the first job (no live run
    included its item then) and before the provider's cancel: B includes the item, and the
    job it went to collect is cancelled under it; B must not fail the item (exit 6) for a
    retry to buy again. The decision is recorded with the membership lock before the
    provider's call, and a run that finds such a job cancelled buys the item anew: B
    completes every item, each with one job that was not cancelled; the kept jobs are
    collected, not bought again. Counted from the fake provider's own log."""
    episode, remotes, run_b, jobs = _cancel_admitting_b_in_the_first_call(
        engine, tmp_path, monkeypatch, delay_ms=4000
    )
    assert [j.kept_for for j in jobs] == [None, run_b, run_b] and jobs[0].answer == "canceled"
    outcome = episode.resume(run_b)
    assert outcome.state.value == "completed" and outcome.counts.failed == 0, outcome.message
    cancelled = {e["remote_ref"] for e in provider_log() if e["event"] == "cancel"}
    assert cancelled == {remotes[0]}
    made = jobs_per_key()
    assert sorted(made.values()) == [1, 1, 2]  # the cancelled job's item bought once more
    assert check_episodes(engine, "weekly") == []


def test_runs_created_while_another_run_of_the_episode_is_cancelled_keep_their_items(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """Three processes per trial: one cancels run A over every item while two create runs
    over the same items, each with its own fingerprint. A cancel must not cancel the items
    of a run it could not see yet (its "no live run includes it" was read before the new
    run committed: the new run's items stayed cancelled), and two creations restarting the
    same cancelled items must not deadlock (Postgres: inserting the memberships takes share
    locks on the items that the same transactions then update). Run creation and the
    cancels that depend on membership take the episode's membership lock first."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(6)]))
    home = str(tmp_path / "home")
    args = (database_url, home, episode.episode_id)
    answers = w.run_processes(
        [
            (w.membership_worker, (*args, "cancel", 25)),
            (w.membership_worker, (*args, "create", 25)),
            (w.membership_worker, (*args, "create", 25)),
        ]
    )
    assert [a for answer in answers for a in answer["errors"]] == []
    assert [a for answer in answers for a in answer["cancelled_in_live_run"]] == []


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_two_runs_restarting_the_same_cancelled_items_never_deadlock(
    engine: Engine, tmp_path: Path
) -> None:
    """Two runs over the same cancelled items, created at once with different fingerprints,
    both wait at an item a third session holds: then both insert their memberships (share
    locks on the items) and update the items, each waiting for the other's share lock (a
    deadlock: one creation aborted). Serialized per episode, the second creation waits for
    the first, and both runs are created with every item pending."""
    import threading

    from sqlalchemy import text

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(6)]))
    first = new_run(episode)
    RunStore(engine).transition_run(first, RunState.CANCELLED)
    with engine.connect() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())
        assert set(conn.execute(select(ItemRow.state)).scalars()) == {"cancelled"}

    outcomes: dict[str, object] = {}

    def create(name: str) -> None:
        try:
            outcomes[name] = admit(engine, episode.episode_id, idempotency_key=name).run_id
        except Exception as exc:
            outcomes[name] = exc

    blocker = engine.connect()
    blocker.begin()
    blocker.execute(text("SELECT 1 FROM items WHERE id = :i FOR UPDATE"), {"i": pks[2]})
    threads = [threading.Thread(target=create, args=(n,)) for n in ("one", "two")]
    for thread in threads:
        thread.start()
    _until_waiting(engine, 2)
    _release(blocker, threads, outcomes)
    for name in ("one", "two"):
        assert _item_states(engine, outcomes[name]) == ["pending"] * len(pks)


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
@pytest.mark.parametrize("canceller", ["runs cancel", "sweep"])
def test_a_cancel_never_cancels_the_items_of_a_run_created_while_it_decided(
    engine: Engine, tmp_path: Path, canceller: str
) -> None:
    """Run B is being created over run A's items (memberships inserted, not committed) when
    A is cancelled, or the sweep reaps A's orphaned items (A cancelled by a dispatcher that
    found it re-planned): "no other live run includes the item", read before B commits,
    would not see B, cancelling B's items and leaving B nothing to do. Both decide under
    the episode's membership lock, after B commits. The
    order is forced with a third session: it holds one item (cancelled, so B restarts it)
    with a lock that lets B insert its memberships but not update the item."""
    import threading

    from sqlalchemy import text

    from episodic.pipeline.admission import dedup_policy
    from episodic.storage.models import RunRow
    from episodic.storage.sweep import Sweeper

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(6)]))
    run_a = new_run(episode)
    with engine.begin() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())
        conn.execute(update(ItemRow).where(ItemRow.id == pks[-1]).values(state="cancelled"))

    outcomes: dict[str, object] = {}

    def create() -> None:
        try:
            outcomes["b"] = admit(engine, episode.episode_id, idempotency_key="b").run_id
        except Exception as exc:
            outcomes["b"] = exc

    if canceller == "sweep":  # cancelled as a re-planned run's dispatcher does: the row only
        with engine.begin() as conn:
            conn.execute(update(RunRow).where(RunRow.id == run_a).values(state="cancelled"))

    def cancel() -> None:
        try:
            if canceller == "sweep":
                policy = dedup_policy(load_settings())
                outcomes["cancel"] = Sweeper(engine).sweep(policy).moved["orphaned_items"]
            else:
                outcomes["cancel"] = RunStore(engine).transition_run(run_a, RunState.CANCELLED)
        except Exception as exc:
            outcomes["cancel"] = exc

    blocker = engine.connect()
    blocker.begin()
    blocker.execute(text("SELECT 1 FROM items WHERE id = :i FOR NO KEY UPDATE"), {"i": pks[-1]})
    threads = [threading.Thread(target=create), threading.Thread(target=cancel)]
    threads[0].start()
    _until_waiting(engine, 1)  # B inserted its memberships and waits to restart the held item
    threads[1].start()
    _until_waiting(engine, 2)  # the cancel waits too (for B's share locks, or the membership lock)
    _release(blocker, threads, outcomes)
    assert _item_states(engine, outcomes["b"]) == ["pending"] * len(pks)


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_run_that_changes_the_plan_never_deadlocks_with_a_run_being_created(
    engine: Engine, tmp_path: Path
) -> None:
    """`generate --hero-candidates` records its changed plan when admitted, with the
    episode's row locked; a plain `generate` of the same episode inserts a run, whose
    foreign key needs a share lock on that row. The membership lock taken after the
    episode's row by the one and before it by the other would deadlock, one command
    failing; every admission takes it first. The order is forced
    with a third session holding the episode's row (as `mark_generated` or `plan` do)."""
    import threading
    import uuid

    from sqlalchemy import text

    from episodic.core.dedup import RunRequest
    from episodic.pipeline.admission import dedup_policy
    from episodic.storage.admission import AdmissionStore
    from episodic.storage.models import EpisodeRow
    from episodic.storage.plans import PlanRecord, PlanStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(6)]))
    plans = PlanStore(engine)
    admission = AdmissionStore(engine)
    with engine.connect() as conn:
        episode_pk = conn.execute(
            select(EpisodeRow.id).where(EpisodeRow.episode_id == episode.episode_id)
        ).scalar_one()
    current = plans.current_plan(episode_pk)
    assert current is not None
    changed = {**current[1], "note": "hero candidates"}
    outcomes: dict[str, object] = {}

    def replan() -> None:
        try:
            outcomes["replan"] = admission.admit(
                episode_pk,
                RunRequest("weekly", episode.episode_id, "generate", {"hero": 2}),
                {"hero": 2},
                [],
                [],
                policy=dedup_policy(load_settings()),
                run_id=str(uuid.uuid4()),
                replan=PlanRecord(changed, "f" * 64, current[2], "generate --hero-candidates 2"),
            ).run_id
        except Exception as exc:
            outcomes["replan"] = exc

    def create() -> None:
        try:
            outcomes["plain"] = admit(engine, episode.episode_id, idempotency_key="plain").run_id
        except Exception as exc:
            outcomes["plain"] = exc

    blocker = engine.connect()
    blocker.begin()
    blocker.execute(text("SELECT 1 FROM episodes WHERE id = :e FOR UPDATE"), {"e": episode_pk})
    threads = [threading.Thread(target=replan), threading.Thread(target=create)]
    threads[0].start()
    _until_waiting(engine, 1)  # the changed plan waits for the episode's row
    threads[1].start()
    _until_waiting(engine, 2)  # the plain run waits too
    _release(blocker, threads, outcomes)
    assert all(isinstance(o, str) for o in outcomes.values()), outcomes


def test_run_creation_never_deadlocks_with_a_heartbeat_renewing_the_same_items(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """A worker's heartbeat renews its claims (items locked in ascending id order) while
    other runs of the episode are created (their memberships' foreign keys take share locks
    on the same items, in the order the lookup returned them, not ascending). On Postgres
    a renewal's FOR UPDATE would wait for those share locks and they for it, a deadlock.
    Rows locked to update non-key columns are locked FOR NO KEY UPDATE, which foreign-key
    checks never wait for, and memberships are inserted in id order."""
    from episodic.pipeline.runner import new_owner
    from episodic.storage.claims import ClaimStore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(30)]))
    run_id = _running_run(episode)
    owner = new_owner()
    with engine.connect() as conn:
        pks = list(conn.execute(select(ItemRow.id).order_by(ItemRow.id)).scalars())
    claims = ClaimStore(engine)
    got = claims.claim_many(
        [(pk, True) for pk in pks], run_id, owner, lease_s=600, max_attempts=3, profile="fake"
    )
    assert all(getattr(g, "action", None) == "submit" for g in got), got
    for _ in range(3):  # rows rewritten out of id order: a lookup by key scans them so
        for pk in pks[::-1]:
            with engine.begin() as conn:
                conn.execute(update(ItemRow).where(ItemRow.id == pk).values(attempts=1))
    home = str(tmp_path / "home")
    answers = w.run_processes(
        [
            (
                w.renew_or_admit_worker,
                (database_url, home, episode.episode_id, run_id, owner, "renew", 8.0),
            ),
            (
                w.renew_or_admit_worker,
                (database_url, home, episode.episode_id, run_id, owner, "admit", 8.0),
            ),
        ]
    )
    assert [e for answer in answers for e in answer["errors"]] == []
    assert all(answer["done"] > 5 for answer in answers), answers
