"""A PostgreSQL outage under a running batch: the server restarted (a clean shutdown
or a crash that recovers from WAL) or its connections killed. A store call that lost its
connection before anything it wrote was committed is retried until the database is back; one
that may have committed is never retried. A lost connection does not end the whole
generation with an error.

PostgreSQL only by nature, except the lost claim reply, simulated on both backends: SQLite
has no connection to lose (its locked database is the fault suite's `sqlite-locked`
scenario).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from episodic.storage import tx
from episodic.storage.admission import AdmissionStore
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.tx import idempotent, retry_outages
from tests.databases import terminate_other_sessions
from tests.generation import jobs_per_key, new_episode, provider_log, write_playlist
from tests.pgcluster import PrivateCluster, cluster_unavailable

EPISODIC = str(Path(sys.executable).parent / "episodic")


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_store_call_whose_connection_was_killed_is_retried_and_answers(engine: Engine) -> None:
    episode = new_episode(engine)
    episodes = EpisodeRepository(engine)
    pk = episodes.episode_pk("weekly", episode.episode_id)  # a pooled connection now exists
    assert terminate_other_sessions(engine) >= 1
    with pytest.raises(OperationalError):  # what every store call did before
        EpisodeRepository.episode_pk.__wrapped__(episodes, "weekly", episode.episode_id)  # type: ignore[attr-defined]
    episodes.episode_pk("weekly", episode.episode_id)  # warm the pool again
    assert terminate_other_sessions(engine) >= 1
    assert episodes.episode_pk("weekly", episode.episode_id) == pk


@retry_outages
class _Probe:
    """A store whose call writes, then reads; the connection is killed in between or before."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls = 0

    def write_then_read(self, kill_before_write: bool) -> int:
        self.calls += 1
        if self.calls == 1 and kill_before_write:
            assert terminate_other_sessions(self.engine) >= 1
        with tx.write(self.engine) as conn:
            conn.execute(text("INSERT INTO outage_probe VALUES (1)"))
        if self.calls == 1 and not kill_before_write:
            assert terminate_other_sessions(self.engine) >= 1
        with tx.read(self.engine) as conn:
            return int(conn.execute(text("SELECT count(*) FROM outage_probe")).scalar_one())

    @idempotent
    def upsert_then_read(self) -> int:
        """Running it twice is running it once: retried even after its commit."""
        self.calls += 1
        with tx.write(self.engine) as conn:
            conn.execute(text("INSERT INTO outage_once VALUES (7) ON CONFLICT DO NOTHING"))
        if self.calls == 1:
            assert terminate_other_sessions(self.engine) >= 1
        with tx.read(self.engine) as conn:
            return int(conn.execute(text("SELECT count(*) FROM outage_once")).scalar_one())


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_call_that_lost_its_connection_is_retried_only_if_nothing_it_wrote_committed(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE outage_probe (n integer)"))
    probe = _Probe(engine)
    # Lost before its write: retried, the write made once.
    assert probe.write_then_read(kill_before_write=True) == 1
    assert probe.calls == 2
    # Lost after its write committed: retrying would write twice, so the caller sees the error.
    probe.calls = 0
    with pytest.raises(OperationalError):
        probe.write_then_read(kill_before_write=False)
    assert probe.calls == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outage_probe")).scalar_one() == 2
    # An idempotent method is retried even after its write committed.
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE outage_once (n integer PRIMARY KEY)"))
    probe.calls = 0
    assert probe.upsert_then_read() == 1
    assert probe.calls == 2


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    reason = cluster_unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason} (under CI=true the restart test must run)")
        pytest.skip(reason)
    with PrivateCluster() as made:
        yield made


@pytest.mark.slow
def test_a_generation_rides_out_postgres_restarts(
    cluster: PrivateCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`episodic generate` of 6 items (1.5 s each, 3 at a time) while the server crashes
    (immediate: WAL recovery) and then shuts down cleanly (fast), each down for a second: the
    run completes, exit 0, one provider job per item (the fake provider's own log). Before, it
    ended with 'error: database error' at the first restart."""
    url = cluster.create_database("outage")
    providers = tmp_path / "providers.yaml"
    providers.write_text(
        "profiles:\n  slow:\n    kind: fake\n    cost_per_image_minor: 4\n"
        "    max_concurrency: 3\n    delay_ms: 1500\n    max_job_s: 10\n"
    )
    log = tmp_path / "provider.jsonl"
    env = {
        "EPISODIC_DATABASE_URL": url,
        "EPISODIC_PROVIDERS_FILE": str(providers),
        "EPISODIC_FAKE_PROVIDER_LOG": str(log),
        "EPISODIC_HOME": str(tmp_path / "home"),
        "EPISODIC_DEBUG": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    engine = make_engine(url)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", [f"v{n}" for n in range(6)], profile="slow"))
    engine.dispose()
    batch = subprocess.Popen(
        [EPISODIC, "generate", episode.episode_id, "--json", "--concurrency", "3"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first paid call is out: the run is mid-flight
    cluster.restart("immediate", 1.0)
    time.sleep(1.0)
    cluster.restart("fast", 1.0)
    out, err = batch.communicate(timeout=180)
    assert batch.returncode == 0, err
    assert json.loads(out)["state"] == "completed"
    jobs = jobs_per_key()
    assert len(jobs) == 6 and set(jobs.values()) == {1}, provider_log()
    assert Counter(e["event"] for e in provider_log())["job_created"] == 6


def test_a_run_whose_claim_commit_reply_was_lost_gives_it_back_and_goes_on(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT of a claim reached the database but its reply was lost (a connection
    killed at that moment): the run ended with the error, and the claim's intent, never sent,
    stays open. A provider that can only look jobs up would find nothing, which proves
    nothing, so the item would wait for an operator's --force-resubmit (as under
    pg_terminate_backend storms); nor may the run end with the error. The process gives the
    claim back and goes on: the same run claims the item again and completes, each item
    paid once. On both backends (the lost reply is simulated: the real claim commits, then
    the call fails as a dropped connection does)."""
    import dataclasses

    from episodic.providers.fake import FakeProvider
    from episodic.storage.claims import ClaimStore

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    real_init = FakeProvider.__init__

    def lookup_only(self: FakeProvider, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        caps = self.capabilities
        self.capabilities = dataclasses.replace(caps, idempotent_create=False)

    monkeypatch.setattr(FakeProvider, "__init__", lookup_only)
    lost = _lose_commit_replies(monkeypatch, ClaimStore, "claim_many", times=1)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one", "two"]))
    outcome = episode.generate(concurrency=1)
    assert lost, "the lost reply was not simulated"
    assert outcome.state.value == "completed", outcome.message
    jobs = jobs_per_key()
    assert len(jobs) == 2 and set(jobs.values()) == {1}, provider_log()
    from episodic.pipeline.check import check_episodes

    assert check_episodes(engine, "weekly") == []


def test_a_completion_whose_commit_reply_was_lost_is_answered_and_the_run_goes_on(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT of an item's completion (outcome, cost, image) reached the database but its
    reply was lost. Nothing is in doubt, so the run must not end with the error; a plain
    retry would find its own completion and call the item taken over. The retry recognizes
    its own committed completion: the run completes, each
    item paid once and its cost counted once. On both backends (the lost reply is simulated
    through the store's real outage decorator: the real completion commits, then the call
    fails as a dropped connection does)."""
    from episodic.pipeline.check import check_episodes
    from episodic.storage.ledger import LedgerStore

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    lost = _lose_commit_replies(monkeypatch, LedgerStore, "complete", times=2)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one", "two", "three"]))
    outcome = episode.generate(concurrency=2)
    assert len(lost) == 2, "the lost replies were not simulated"
    assert outcome.state.value == "completed", outcome.message
    assert outcome.counts.completed == 3
    jobs = jobs_per_key()
    assert len(jobs) == 3 and set(jobs.values()) == {1}, provider_log()
    with engine.connect() as conn:
        costs = conn.execute(text("SELECT count(*), sum(amount_micros) FROM cost_entries")).one()
    assert costs[0] == 3
    assert check_episodes(engine, "weekly") == []


@pytest.mark.parametrize("dedup_window_s", ["600", "0"])
def test_an_admission_whose_commit_reply_was_lost_finds_its_own_run(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dedup_window_s: str
) -> None:
    """The COMMIT that created a run reached the database but its reply was lost. A retry
    could take its own pending run for another caller's, or, with deduplication off, create
    a second run; so the run's id is chosen before the call and the retry finds the run it
    made: one run, completed, each item paid once. On both backends."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_DEDUP_WINDOW_S", dedup_window_s)
    lost = _lose_commit_replies(monkeypatch, AdmissionStore, "admit", times=1)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one", "two"]))
    outcome = episode.generate(concurrency=2)
    assert lost, "the lost reply was not simulated"
    assert outcome.state.value == "completed", outcome.message
    jobs = jobs_per_key()
    assert len(jobs) == 2 and set(jobs.values()) == {1}, provider_log()
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT state FROM runs")).scalars().all()
    assert runs == ["completed"]


def _lose_commit_replies(
    monkeypatch: pytest.MonkeyPatch, store: type, method: str, *, times: int
) -> list[int]:
    """The store's `method` really runs and commits, then its first `times` calls fail as a
    dropped connection does after a COMMIT was sent; the store's own outage decorator (and
    the method's `idempotent` marker) decide what happens next. Returns the list that grows
    by one per reply lost."""
    import psycopg

    from episodic.storage.tx import retry_outage

    original = getattr(store, method).__wrapped__
    lost: list[int] = []

    def reply_lost(self: object, *args: object, **kwargs: object) -> object:
        answer = original(self, *args, **kwargs)
        if len(lost) < times:
            lost.append(1)
            raise OperationalError(
                "COMMIT",
                {},
                psycopg.OperationalError("server closed the connection unexpectedly"),
                connection_invalidated=True,
            )
        return answer

    reply_lost.__episodic_idempotent__ = getattr(  # type: ignore[attr-defined]
        original, "__episodic_idempotent__", False
    )
    monkeypatch.setattr(store, method, retry_outage(reply_lost))
    return lost
