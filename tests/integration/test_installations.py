"""Two installations (production and staging: two databases, two homes) sharing one provider
account never replay, find, collect or cancel each other's jobs: every reference they send
carries their own installation id. Money is counted at the provider (the servers' jobs,
the fake provider's job files), never from our tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from episodic.core.exit_codes import ExitCode
from episodic.storage.engine import make_engine
from episodic.storage.installation import installation_id
from episodic.storage.models import ItemRow, SubmissionRow
from episodic.storage.schema import upgrade
from tests.databases import PostgresDatabases, SqliteDatabases
from tests.generation import Episode, made_jobs_per_key, new_episode, write_playlist
from tests.http_server import TOKEN, PredictionsServer
from tests.jobs_servers import TOKEN as JOBS_TOKEN
from tests.jobs_servers import ReplicateServer

TITLES = ["a", "b", "c"]


@dataclass
class Installation:
    """One installation: its own database (migrated from empty, so its own id) and home."""

    url: str
    engine: Engine
    home: Path

    @property
    def id(self) -> str:
        return installation_id(self.engine)

    def enter(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Commands from here on are this installation's (its database, its home)."""
        monkeypatch.setenv("EPISODIC_DATABASE_URL", self.url)
        monkeypatch.setenv("EPISODIC_HOME", str(self.home))

    def submissions(self) -> list[tuple[str, str | None, str]]:
        """(client reference, remote reference, state) of every submission it recorded."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    SubmissionRow.client_reference, SubmissionRow.remote_ref, SubmissionRow.state
                ).order_by(SubmissionRow.id)
            ).all()
        return [(r[0], r[1], r[2]) for r in rows]


def _two(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, *, copied: bool
) -> Iterator[tuple[Installation, Installation]]:
    """Production and staging, two databases and two homes: upgraded from empty (each its
    own id) or, `copied`, both clones of one migrated database (as a dump of production
    restored into staging: the same id)."""
    made: list[Installation] = []
    dropped: list[str] = []
    pg: PostgresDatabases | None = None
    for name in ("production", "staging"):
        if backend == "sqlite":
            sqlite: SqliteDatabases = request.getfixturevalue("sqlite_databases")
            url = sqlite.fresh(tmp_path / name / "db", migrated=copied)
        else:
            pg = request.getfixturevalue("postgres_databases")
            database = pg.fresh(migrated=copied)
            dropped.append(database)
            url = pg.url(database)
        engine = make_engine(url)
        upgrade(engine)
        made.append(Installation(url, engine, tmp_path / name / "home"))
    production, staging = made
    assert (production.id == staging.id) is copied
    yield production, staging
    for each in made:
        each.engine.dispose()
    for database in dropped:
        assert pg is not None
        pg.drop(database)


@pytest.fixture
def installations(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Installation, Installation]]:
    yield from _two(backend, request, tmp_path, copied=False)


@pytest.fixture
def copied_installations(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Installation, Installation]]:
    yield from _two(backend, request, tmp_path, copied=True)


def _profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("profiles:\n  real:\n" + body)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))


def _replicate_profile(
    server: ReplicateServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Replicate profile against the local server (lookup by input left off)."""
    _profiles(
        tmp_path,
        monkeypatch,
        f"    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {server.base_url}\n    credential_env: IMAGE_KEY\n"
        "    cost_per_image_minor: 3\n    timeout_s: 2.0\n    poll_interval_s: 0.02\n",
    )
    monkeypatch.setenv("IMAGE_KEY", JOBS_TOKEN)


def _episode(installation: Installation, tmp_path: Path, titles: list[str]) -> Episode:
    """The same slot and the same playlist in each installation (staging mirrors production)."""
    episode = new_episode(installation.engine)
    episode.plan(write_playlist(tmp_path / "playlist", titles, profile="real"))
    return episode


def _polls(server: ReplicateServer, job: str) -> int:
    return sum(1 for r in server.requests if r.path == f"/v1/predictions/{job}")


def _own_references(installation: Installation) -> None:
    """Every reference it sent starts with its own id."""
    for reference, _remote, _state in installation.submissions():
        assert reference.startswith(f"{installation.id}-"), reference


def test_two_installations_on_one_idempotent_provider_each_pay_for_their_own_jobs(
    installations: tuple[Installation, Installation],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each installation's Idempotency-Key is its own (a shared `{item key}-{attempt}` would
    have the server answer staging's creates with production's jobs, and staging ship
    production's images)."""
    _each_pays_for_its_own(installations, tmp_path, monkeypatch)


def test_a_copied_database_given_its_own_id_pays_for_its_own_jobs(
    copied_installations: tuple[Installation, Installation],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A staging database restored from production's carries production's id; `episodic db
    installation --renew` gives it its own, and its next references carry it at once."""
    from episodic.cli.app import run

    production, staging = copied_installations
    staging.enter(monkeypatch)
    before = staging.id
    assert run(["db", "installation", "--renew"]) == 0
    assert staging.id != before and production.id == before
    _each_pays_for_its_own(copied_installations, tmp_path, monkeypatch)


def _each_pays_for_its_own(
    installations: tuple[Installation, Installation],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    production, staging = installations
    with PredictionsServer(honour_idempotency=True) as server:
        _profiles(
            tmp_path,
            monkeypatch,
            f"    kind: http\n    base_url: {server.base_url}\n"
            "    credential_env: TEST_IMAGE_TOKEN\n    cost_per_image_minor: 5\n"
            "    idempotent_create: true\n    timeout_s: 2\n    poll_interval_s: 0.02\n",
        )
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        outcomes = []
        for installation in (production, staging):
            installation.enter(monkeypatch)
            outcomes.append(_episode(installation, tmp_path, TITLES).generate())
        assert [o.exit_code for o in outcomes] == [ExitCode.OK, ExitCode.OK]
        # the provider made one job per item of each installation, each paid once
        assert len(server.jobs) == 2 * len(TITLES)
        assert set(server.jobs_made.values()) == {1}
        for installation in (production, staging):
            _own_references(installation)
            sent = installation.submissions()
            assert len(sent) == len(TITLES)
            for reference, remote, state in sent:
                assert state == "succeeded"
                # the job it recorded is the one its own create made, and it downloaded it
                assert remote is not None and server.jobs[remote]["client_reference"] == reference
                assert server.downloads[remote] == 1
        remotes = [{s[1] for s in i.submissions()} for i in (production, staging)]
        assert not remotes[0] & remotes[1]  # no job is in both ledgers


def test_two_installations_on_one_fake_provider_account_never_replay_each_other(
    installations: tuple[Installation, Installation],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fake provider honours idempotent create by client reference: one account (its
    job folder) shared by both homes: staging's creates are not replays of production's
    jobs (`submit_replayed`)."""
    production, staging = installations
    shared = tmp_path / "account"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_DIR", str(shared))  # the one account's jobs
    _profiles(tmp_path, monkeypatch, "    kind: fake\n    cost_per_image_minor: 4\n")
    log = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(log))
    for installation in (production, staging):
        installation.enter(monkeypatch)
        assert _episode(installation, tmp_path, TITLES).generate().exit_code == ExitCode.OK
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert not [e for e in events if e["event"] == "submit_replayed"]
    jobs = made_jobs_per_key(production.home)  # the account's job files
    assert sum(jobs.values()) == 2 * len(TITLES) and set(jobs.values()) == {2}
    for installation in (production, staging):
        _own_references(installation)
        assert len({s[1] for s in installation.submissions()}) == len(TITLES)
    assert not {s[1] for s in production.submissions()} & {s[1] for s in staging.submissions()}


def test_on_replicate_staging_never_adopts_collects_or_cancels_productions_prediction(
    installations: tuple[Installation, Installation],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Replicate finds a prediction by its exact input only, and staging's input is
    production's: when staging's create is lost at the gateway (nothing made), a lookup would
    find production's running prediction and record it as staging's job, and staging's
    `runs cancel` would cancel production's prediction. Without `lookup_by_input` the adapter
    declares no lookup: staging's item waits for an operator, production's job is untouched."""
    from episodic.cli.app import run

    production, staging = installations
    with ReplicateServer(processing_polls=10**6) as server:  # predictions run for good
        _replicate_profile(server, tmp_path, monkeypatch)
        production.enter(monkeypatch)
        first = _episode(production, tmp_path, ["fox"]).generate(collect_timeout_s=0.3)
        assert first.state.value == "failed"  # its job runs on: left for later collection
        ((_ref, prod_job, prod_state),) = production.submissions()
        assert prod_job in server.jobs and prod_state == "accepted"
        polls = _polls(server, prod_job)
        staging.enter(monkeypatch)
        server.lose_creates = 1  # staging's create never reaches Replicate
        second = _episode(staging, tmp_path, ["fox"]).generate(collect_timeout_s=0.3)
        assert second.exit_code != ExitCode.OK
        capsys.readouterr()
        run(["runs", "cancel", second.run_id])
        assert server.cancels[prod_job] == 0
        ((_ref, staging_job, _state),) = staging.submissions()
        assert staging_job is None  # unknown: never production's prediction
        assert _polls(server, prod_job) == polls  # staging never collected it
        assert len(server.jobs) == 1 and sum(server.jobs_made.values()) == 1
        production.enter(monkeypatch)  # production's own cancel still reaches its job
        assert run(["runs", "cancel", first.run_id]) == 0
        assert server.cancels[prod_job] == 1


def test_an_open_submission_from_before_the_upgrade_is_settled_by_the_reference_it_sent(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job accepted by the provider under a reference of the old form (`{item key}-1`,
    made before migration 0012) whose reply was lost: the resumed run asks the provider by
    the recorded reference, never a recomputed one, so it finds and collects that job and
    makes none under the new form."""
    from episodic.core.runs import Refusal
    from episodic.core.settings import load_settings
    from episodic.core.states import RunState
    from episodic.pipeline.runner import new_owner
    from episodic.providers.base import ImageRequest
    from episodic.providers.fake import FakeProvider
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.runs import RunStore
    from tests.generation import new_run, provider_log

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["fox"]))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING)
    claims = ClaimStore(engine)
    leases = LeaseStore(engine)
    with engine.connect() as conn:
        (pk,) = conn.execute(select(ItemRow.id)).one()
    claim = claims.claim(pk, run_id, new_owner(), lease_s=30, max_attempts=3, profile="fake")
    assert not isinstance(claim, Refusal) and claim.submission is not None
    old = f"{claim.item.idempotency_key}-1"  # what the code before 0012 recorded and sent
    with engine.begin() as conn:
        conn.execute(
            SubmissionRow.__table__.update()  # type: ignore[attr-defined]
            .where(SubmissionRow.id == claim.submission.pk)
            .values(client_reference=old)
        )
    provider = FakeProvider(
        profile_id="fake", state_dir=load_settings().home_path / "fake-provider"
    )
    item = claim.item
    provider.submit(ImageRequest(old, episode.episode_id, item.item_id, item.prompt, item.seed))
    leases.release(claim, "interrupted")  # its process died before the reply was recorded
    outcome = episode.resume(run_id)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert [(r, s) for r, _remote, s in _submissions(engine)] == [(old, "succeeded")]
    assert [e["client_reference"] for e in provider_log() if e["event"] == "lookup"] == [old]
    jobs = made_jobs_per_key()  # the provider's own job files
    assert jobs == {item.idempotency_key: 1}


def _submissions(engine: Engine) -> list[tuple[str, str | None, str]]:
    return Installation("", engine, Path()).submissions()


def test_a_copy_renewed_never_collects_or_cancels_the_originals_open_jobs(
    installations: tuple[Installation, Installation],
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Staging restored from production while production had a job running at the provider,
    then renewed as documented. The copy's `runs cancel` would cancel production's job and
    its resume collect it (one job at the provider, recorded by both ledgers, staging
    shipping production's image). Renewing closes the inherited
    open submissions: the copy never polls or cancels them, its resume buys its own."""
    import shutil

    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from episodic.cli.app import run

    production, staging = installations
    with ReplicateServer(processing_polls=10**6) as server:  # predictions run for good
        _replicate_profile(server, tmp_path, monkeypatch)
        production.enter(monkeypatch)
        first = _episode(production, tmp_path, ["fox"]).generate(collect_timeout_s=0.3)
        ((_ref, prod_job, prod_state),) = production.submissions()
        assert prod_job in server.jobs and prod_state == "accepted"
        polls = _polls(server, prod_job)
        # staging := a copy of production as it is now (a restored dump)
        production.engine.dispose()
        staging.engine.dispose()
        if backend == "sqlite":
            shutil.copyfile(
                make_url(production.url).database or "", make_url(staging.url).database or ""
            )
        else:
            pg: PostgresDatabases = request.getfixturevalue("postgres_databases")
            name, source = make_url(staging.url).database, make_url(production.url).database
            with pg.admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'))
        assert staging.id == production.id
        staging.enter(monkeypatch)
        capsys.readouterr()
        assert run(["db", "installation", "--renew", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["disowned"] == 1
        assert [s for _r, _j, s in staging.submissions()] == ["failed"]
        run(["runs", "cancel", first.run_id])
        assert server.cancels[prod_job] == 0
        copied = Episode(staging.engine, first_episode_id(staging))
        copied.resume(first.run_id, collect_timeout_s=0.3)
        assert _polls(server, prod_job) == polls  # the copy never collected it
        assert sum(server.jobs_made.values()) == 2  # its resume bought its own
        bought = [r for r, _j, _s in staging.submissions()][1:]
        assert bought and all(r.startswith(f"{staging.id}-") for r in bought)
        production.enter(monkeypatch)  # production's own cancel still reaches its job
        assert run(["runs", "cancel", first.run_id]) == 0
        assert server.cancels[prod_job] == 1


def first_episode_id(installation: Installation) -> str:
    from episodic.storage.models import EpisodeRow

    with installation.engine.connect() as conn:
        return str(conn.execute(select(EpisodeRow.episode_id)).scalar_one())
