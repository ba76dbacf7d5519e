"""`generate_episode` under the Prefect test harness: cached items, limits, artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from sqlalchemy import create_engine, select

from episodic.core.ids import WeekId
from episodic.core.runs import Claim
from episodic.flows.generate import generate_episode
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from episodic.tasks.generate import generate_item
from tests.generation import (
    Episode,
    jobs_per_key,
    provider_log,
    submissions_per_item,
    write_playlist,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def episode(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    engine = create_engine(harness)
    episode_id = str(
        allocate(
            engine, "weekly", WeekId.parse("2026-W32"), f"k-{tmp_path.name}"
        ).episode.episode_id
    )
    engine.dispose()
    return episode_id


def plan(url: str, episode_id: str, folder: Path, titles: list[str]) -> None:
    from episodic.storage.engine import make_engine

    engine = make_engine(url)
    record_plan(engine, "weekly", episode_id, write_playlist(folder, titles))
    engine.dispose()


def test_the_flow_generates_and_publishes_progress_and_cost(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a", "b", "c"])
    result = generate_episode(episode_id=episode)
    assert result["state"] == "completed" and result["paid_submissions"] == 3
    assert set(submissions_per_item().values()) == {1}
    with get_client(sync_client=True) as client:
        keys = {
            a.key
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="episode-2026-w32"))
            )
        }
    assert {f"episode-{episode.lower()}-progress", f"episode-{episode.lower()}-cost"} <= keys


def test_a_retried_flow_run_makes_no_new_paid_call_for_finished_items(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a", "lost [[LOSE_RESPONSE]]", "c"])
    state = generate_episode.with_options(retries=1, retry_delay_seconds=0)(
        episode_id=episode, return_state=True
    )
    assert state.is_completed(), state.message
    assert state.result()["state"] == "completed"
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1, "v03.p1": 1}
    assert any(e["event"] == "lookup" for e in provider_log())  # reconciled, not resubmitted


def test_a_finished_item_is_a_cache_hit_without_the_database_or_provider(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a"])
    generate_episode(episode_id=episode)
    events_before = len(provider_log())

    @flow
    def recreated() -> object:  # a re-created flow run asking for the same item again
        from episodic.core.settings import load_settings
        from episodic.tasks.results import result_storage

        key, ledger_ref = _only_item(harness)
        item = generate_item.with_options(result_storage=result_storage(load_settings()))
        work = {"item_pk": -1, "owner": "no-owner"}  # never read: the cache answers
        return item(work, "v01.p1", key, ledger_ref, return_state=True)

    state = recreated()
    assert state.name == "Cached"
    assert state.result() == _only_item(harness)[0]  # the item's idempotency key: it is done
    assert len(provider_log()) == events_before


def test_a_copied_database_given_its_own_installation_id_never_reads_the_originals_cache(
    harness: str, episode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A staging database restored from production's holds production's rows (same pk, same
    creation time); with its own installation id (`db installation --renew`) the item's
    cache key differs, so a task asked for it in staging never reads production's "already
    done" from a shared result store. Before, the key was the row alone: a cache hit."""
    from episodic.core.settings import load_settings
    from episodic.storage.engine import make_engine
    from episodic.storage.installation import renew
    from episodic.tasks.results import result_storage

    plan(harness, episode, tmp_path / "p", ["a"])
    generate_episode(episode_id=episode)
    copy = _copy_of(harness, request, tmp_path)
    engine = make_engine(copy)
    renew(engine)
    engine.dispose()
    key, in_copy = _only_item(copy)
    assert key == _only_item(harness)[0] and in_copy != _only_item(harness)[1]
    events_before = len(provider_log())

    @flow
    def in_staging() -> str:
        item = generate_item.with_options(result_storage=result_storage(load_settings()))
        work = {"item_pk": -1, "owner": "no-owner"}  # a miss runs the task: it fails here
        return item(work, "v01.p1", key, in_copy, return_state=True).name

    assert in_staging() != "Cached"
    assert len(provider_log()) == events_before


def _copy_of(url: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A copy of the database at `url` (a dump restored elsewhere), dropped after the test."""
    import shutil

    from sqlalchemy import make_url, text

    from episodic.storage.registry import dispose_all
    from tests.databases import terminate_other_sessions

    dispose_all()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        target = tmp_path / "copy.db"
        shutil.copyfile(str(parsed.database), target)
        return f"sqlite:///{target}"
    databases = request.getfixturevalue("postgres_databases")
    source = create_engine(url)
    terminate_other_sessions(source)
    source.dispose()
    name = f"{parsed.database}_copy"
    with databases.admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{parsed.database}"'))
    request.addfinalizer(lambda: databases.drop(name))
    return databases.url(name)


def _only_item(url: str) -> tuple[str, str]:
    from episodic.storage.engine import make_engine
    from episodic.storage.installation import installation_id
    from episodic.storage.runs import RunStore
    from episodic.tasks.generate import ledger_ref

    engine = make_engine(url)
    store = RunStore(engine)
    (run,) = store.list_runs("weekly")
    (item,) = store.run_items(run.run_id)
    scope = installation_id(engine)
    engine.dispose()
    return item.idempotency_key, ledger_ref(scope, item)


def test_a_missing_episode_fails_before_any_client_is_built(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    state = generate_episode(episode_id="2026-W32-9", return_state=True)
    assert state.is_failed() and "not found" in (state.message or "")
    assert provider_log() == []


def test_episode_id_is_a_required_parameter() -> None:
    import inspect

    parameter = inspect.signature(generate_episode.fn).parameters["episode_id"]
    assert parameter.default is inspect.Parameter.empty
    assert "episode_id" in generate_episode.parameters.required


def test_the_flow_reads_the_credential_from_a_secret_block_and_pays_over_http(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.blocks.system import Secret

    from tests.http_server import TOKEN, PredictionsServer

    with PredictionsServer() as server:
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(
            "profiles:\n  http-secret:\n    kind: http\n"
            f"    base_url: {server.base_url}\n"
            "    credential_secret_block: episodic-test-token\n"
            "    cost_per_image_minor: 5\n    timeout_s: 2\n    poll_interval_s: 0.05\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        Secret(value=TOKEN).save("episodic-test-token", overwrite=True)
        engine = create_engine(harness)
        episode_id = str(
            allocate(engine, "weekly", WeekId.parse("2026-W32"), "secret").episode.episode_id
        )
        engine.dispose()
        from episodic.storage.engine import make_engine

        db = make_engine(harness)
        record_plan(
            db,
            "weekly",
            episode_id,
            write_playlist(tmp_path / "p", ["a", "b"], profile="http-secret"),
        )
        db.dispose()
        result = generate_episode(episode_id=episode_id)
    assert result["state"] == "completed" and result["cost_micros"] == 100_000
    assert sorted(server.accepted.values()) == [1, 1]


@pytest.mark.parametrize(
    "backend", ["sqlite"]
)  # backend-neutral; the ledger runs on both elsewhere
def _cards(flow_run_id: object) -> list[tuple[str, Any]]:
    """The artifacts (cards) the UI shows on one flow run: (key, data)."""
    from prefect.client.schemas.filters import ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            sort=ArtifactSort.ID_DESC,
        )
    return [(str(a.key), a.data) for a in found]


def test_a_generate_run_shows_one_progress_and_one_cost_card_reading_100(
    harness: str, episode: str, tmp_path: Path
) -> None:
    """A generate run shows one `-progress` card per key and run, updated in place (a new
    artifact per publication would leave the live one frozen below 100% beside the final
    one), the final reading 100% for a finished episode."""
    import json

    plan(harness, episode, tmp_path / "p", ["a", "b", "c", "d", "e", "f", "g"])
    state = generate_episode(episode_id=episode, concurrency=2, return_state=True)
    assert state.is_completed(), state
    cards = _cards(state.state_details.flow_run_id)
    keys = [key for key, _ in cards]
    progress, cost = f"episode-{episode.lower()}-progress", f"episode-{episode.lower()}-cost"
    assert sorted(keys) == [cost, progress], keys
    assert float(dict(cards)[progress]) == 100.0
    (row,) = json.loads(dict(cards)[cost])
    assert row["paid calls"] == 7 and row["still running"] == 0 and row["cost"] == "0.28 USD"
    assert row["committed"] == "0.28 USD"  # nothing accepted and not collected
    # Running it again (nothing to do) shows the same figures on its own single cards.
    again = generate_episode(episode_id=episode, return_state=True)
    assert sorted(k for k, _ in _cards(again.state_details.flow_run_id)) == [cost, progress]


def test_cancelling_the_flow_run_pauses_the_run_and_resume_pays_once(
    harness: str, episode: str, tmp_path: Path
) -> None:
    """A cancelled flow run's process gets SIGTERM: in-flight items are marked interrupted,
    the run is paused, and `episodic runs resume` finishes it without paying twice."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from prefect.settings import PREFECT_API_URL

    plan(harness, episode, tmp_path / "p", [f"video {n}" for n in range(1, 7)])
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "EPISODIC_FAKE_DELAY_MS": "2000",
    }
    code = (
        "import episodic.tasks\nfrom episodic.flows.generate import generate_episode\n"
        f"generate_episode(episode_id={episode!r}, concurrency=2)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and sum(submissions_per_item().values()) < 2:
        time.sleep(0.05)
    assert sum(submissions_per_item().values()) >= 2, "the flow never started paying"
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=90)

    from episodic.storage.engine import make_engine
    from episodic.storage.runs import RunStore

    engine = make_engine(harness)
    store = RunStore(engine)
    (run,) = store.list_runs("weekly")
    items = store.run_items(run.run_id)
    engine.dispose()
    assert run.state == "paused"
    assert any(i.error_text == "interrupted" and i.state == "failed" for i in items)
    before = submissions_per_item()
    resumed = subprocess.run(
        [sys.executable, "-m", "episodic.cli.app", "runs", "resume", run.run_id, "--json"],
        env={**os.environ, "EPISODIC_FAKE_DELAY_MS": "0"},
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "completed"
    after = submissions_per_item()
    assert set(after.values()) == {1} and len(after) == 6
    assert all(after[key] == 1 for key in before)


def test_two_flow_runs_of_one_episode_split_the_items_and_none_fails(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow retry racing its original, two workers on one slot: the same episode, at once."""
    import threading

    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId
    from prefect.client.schemas.objects import StateType

    from tests.generation import jobs_per_key

    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "150")
    plan(harness, episode, tmp_path / "p", [f"t{n}" for n in range(8)])
    barrier = threading.Barrier(2)
    states: list[object] = []

    def run() -> None:
        barrier.wait()
        states.append(generate_episode(episode_id=episode, concurrency=4, return_state=True))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert len(states) == 2 and all(s.is_completed() for s in states)  # type: ignore[attr-defined]
    results = [s.result() for s in states]  # type: ignore[attr-defined]
    assert all(r["state"] == "completed" for r in results)
    runs = {r["run_id"] for r in results} - {None}  # None: the other had already finished
    assert len(runs) == 1, results  # the second flow run joined the first one's run
    if None not in {r["run_id"] for r in results}:
        assert sorted(r["deduplicated"] for r in results) == [False, True]
    assert len(jobs_per_key()) == 8 and set(jobs_per_key().values()) == {1}
    flow_runs = [s.state_details.flow_run_id for s in states]  # type: ignore[attr-defined]
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=flow_runs))
        )
    assert task_runs and len(task_runs) == 8  # one task per item, none for followed ones
    assert not [t for t in task_runs if t.state_type == StateType.FAILED], "a red task run"


def test_an_item_task_that_fails_before_its_work_leaves_no_intent_behind(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task that fails before it loads its claim (here: its worker cannot build the
    # provider) never made the paid call. The flow withdraws the intent it committed with
    # the claim and takes the item back once (nothing was sent); when that fails too, the
    # next run submits the item normally instead of reconciling it (which a provider that
    # can neither look jobs up nor dedupe creates would leave to an operator).
    import episodic.tasks.generate as item_tasks
    from episodic.core.errors import ProviderConfigError
    from episodic.storage.engine import make_engine
    from episodic.storage.models import SubmissionRow

    plan(harness, episode, tmp_path / "p", ["a", "b"])
    real = item_tasks.item_runner
    failed: list[str] = []

    def broken_worker(
        pipeline: str, episode_id: str, profile: str | None = None, owner: str | None = None
    ) -> object:
        failed.append(episode_id)  # every item task on this worker, and each taken back
        raise ProviderConfigError("this worker has no credential")

    monkeypatch.setattr(item_tasks, "item_runner", broken_worker)
    first = generate_episode(episode_id=episode, concurrency=1, return_state=True)
    assert len(failed) == 4 and not first.is_completed()  # 2 items, each taken back once
    engine = make_engine(harness)
    with engine.connect() as conn:
        states = list(conn.execute(select(SubmissionRow.state)).scalars())
    engine.dispose()
    assert states == [], states  # the unsent intents are gone, nothing is unknown
    monkeypatch.setattr(item_tasks, "item_runner", real)
    again = generate_episode(episode_id=episode)
    assert again["state"] == "completed"
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1}
    assert not [e for e in provider_log() if e["event"] == "lookup"]  # submitted, not reconciled


def test_a_worker_rebuilds_its_engine_when_the_episode_moves_to_another_profile(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long-lived worker (a Dask process) caches each episode's engine. A claim made under
    # another provider profile (the episode was re-planned) gets an engine for the current
    # plan; a claim made under the profile the plan no longer uses is refused before it loads.
    from episodic.tasks.process import ItemNotCompleted, item_runner

    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n"
        "  fake-a:\n    kind: fake\n    cost_per_image_minor: 4\n"
        "  fake-b:\n    kind: fake\n    cost_per_image_minor: 6\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    engine = create_engine(harness)
    record_plan(engine, "weekly", episode, write_playlist(tmp_path / "a", ["x"], profile="fake-a"))
    assert item_runner("weekly", episode, "fake-a").profile.id == "fake-a"
    record_plan(engine, "weekly", episode, write_playlist(tmp_path / "b", ["x"], profile="fake-b"))
    engine.dispose()
    assert item_runner("weekly", episode, "fake-b").profile.id == "fake-b"
    assert item_runner("weekly", episode, "fake-b") is item_runner("weekly", episode, "fake-b")
    with pytest.raises(ItemNotCompleted, match="now uses 'fake-b'"):
        item_runner("weekly", episode, "fake-a")


def test_the_flow_grows_hero_candidates_and_pays_only_the_new_ones(
    harness: str, episode: str, tmp_path: Path
) -> None:
    """Hero runs from the generate deployment: `hero_candidates` is recorded in the plan,
    so asking for 5 after 3 pays for 2, counted at the provider."""
    plan(harness, episode, tmp_path / "p", ["a", "b"])  # two one-image videos
    first = generate_episode(episode_id=episode, hero_candidates=3)
    assert first["state"] == "completed" and first["paid_submissions"] == 6
    paid = jobs_per_key()
    grown = generate_episode(episode_id=episode, hero_candidates=5)
    assert grown["paid_submissions"] == 4 and grown["skipped"] == 6
    after = jobs_per_key()
    assert len(after) == 10 and set(after.values()) == {1} and after.keys() > paid.keys()
    assert submissions_per_item() == {f"v0{v}.c{c}": 1 for v in (1, 2) for c in range(1, 6)}
    assert generate_episode(episode_id=episode)["paid_submissions"] == 0  # the plan says 5
    for bad in (0, 51, True, "3", 2.0):
        state = generate_episode(episode_id=episode, hero_candidates=bad, return_state=True)
        assert state.is_failed(), bad
    assert jobs_per_key() == after


def test_the_progress_artifact_is_published_off_the_dispatching_thread(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each progress publication is an API call (15-50 ms here); made by the flow's
    dispatching thread, it would hold up the claims of every slot that freed meanwhile.
    Counting returns while a publication is still in flight, and the figures arrive in
    order from the publisher's thread."""
    import threading
    import time

    import episodic.flows.artifacts as artifacts

    plan(harness, episode, tmp_path / "p", ["a", "b", "c", "d"])
    in_flight, release = threading.Event(), threading.Event()
    calls: list[tuple[str, float]] = []
    real_update = artifacts.update_progress_artifact

    def slow_update(artifact_id: object, progress: float) -> object:
        calls.append((threading.current_thread().name, progress))
        in_flight.set()
        assert release.wait(30)
        return real_update(artifact_id, progress)  # type: ignore[arg-type]

    created = threading.Event()
    real_create = artifacts.upsert_artifact

    def create(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_create(*args, **kwargs)
        finally:
            created.set()

    monkeypatch.setattr(artifacts, "upsert_artifact", create)
    monkeypatch.setattr(artifacts, "update_progress_artifact", slow_update)
    monkeypatch.setattr(artifacts.EpisodeProgress, "MIN_INTERVAL_S", 0.0)
    from episodic.storage.engine import make_engine

    engine = make_engine(harness)

    @flow
    def count() -> list[float]:
        progress = artifacts.EpisodeProgress(engine, "weekly", episode)
        assert created.wait(30)
        progress.completed_one()
        assert in_flight.wait(30)  # the publisher is inside its (held) API call...
        for _ in range(3):  # ...and counting goes on without waiting for it
            progress.completed_one()
        release.set()
        deadline = time.monotonic() + 30
        while progress.published[-1:] != [100.0] and time.monotonic() < deadline:
            time.sleep(0.01)
        progress.close()
        return progress.published

    published = count()
    engine.dispose()
    assert {name for name, _ in calls} == {"episode-progress"}
    assert published[0] == 25.0 and published[-1] == 100.0 and published == sorted(published)


def test_a_progress_artifact_that_cannot_be_published_never_fails_the_run(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import episodic.flows.artifacts as artifacts

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("the API is down")

    plan(harness, episode, tmp_path / "p", ["a", "b"])
    monkeypatch.setattr(artifacts, "update_progress_artifact", broken)
    monkeypatch.setattr(artifacts, "get_client", broken)  # every creation and update
    result = generate_episode(episode_id=episode)
    assert result["state"] == "completed" and set(submissions_per_item().values()) == {1}


def test_a_result_storage_block_is_loaded_once_per_run_not_per_item(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPISODIC_RESULT_STORAGE names a Prefect filesystem block (the setting for several
    machines). Prefect resolves a task's result storage at the start of every task run, so
    a slug on the task loaded the block from the API once per item. The results land in the
    block's storage either way."""
    import uuid

    from prefect.blocks.core import Block
    from prefect.filesystems import LocalFileSystem

    shared = tmp_path / "shared-results"
    name = f"results-{uuid.uuid4().hex[:12]}"
    LocalFileSystem(basepath=str(shared)).save(name, overwrite=True)
    slug = f"local-file-system/{name}"
    monkeypatch.setenv("EPISODIC_RESULT_STORAGE", slug)
    loads: list[str] = []
    load = Block.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Block], name: str, *args: object, **kwargs: object) -> object:
        loads.append(name)
        return load(cls, name, *args, **kwargs)

    monkeypatch.setattr(Block, "load", classmethod(counted))
    plan(harness, episode, tmp_path / "p", ["a", "b", "c", "d", "e", "f"])
    result = generate_episode(episode_id=episode, concurrency=3)
    assert result["state"] == "completed" and set(submissions_per_item().values()) == {1}
    assert loads == [slug]
    assert len([f for f in shared.rglob("*") if f.is_file()]) >= 6


def test_no_progress_update_follows_the_final_figure(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A creation or an update of the artifact landing after the flow's final figure (a
    slow proxy) would become the key's latest, showing 0% for a finished episode. So the
    artifact is created on the flow's thread before the run's first item, and `close`
    returns only once the update in flight has landed."""
    import threading

    from prefect.artifacts import Artifact

    import episodic.flows.artifacts as artifacts

    plan(harness, episode, tmp_path / "p", ["a", "b"])
    from prefect.artifacts import create_progress_artifact

    creators: list[str] = []
    real_create = artifacts.upsert_artifact

    def create(*args: Any, **kwargs: Any) -> Any:
        creators.append(threading.current_thread().name)
        return real_create(*args, **kwargs)

    in_flight, release = threading.Event(), threading.Event()
    real_update = artifacts.update_progress_artifact

    def slow_update(artifact_id: object, progress: float) -> object:
        in_flight.set()
        assert release.wait(30)
        return real_update(artifact_id, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "upsert_artifact", create)
    monkeypatch.setattr(artifacts, "update_progress_artifact", slow_update)
    from episodic.storage.engine import make_engine

    engine = make_engine(harness)
    key = f"episode-{episode.lower()}-progress"

    @flow
    def finish() -> object:
        progress = artifacts.EpisodeProgress(engine, "weekly", episode)
        progress.completed_one()
        assert in_flight.wait(30)
        threading.Timer(0.5, release.set).start()  # the update lands half a second later
        progress.close()
        assert release.is_set()  # close waited for it
        return create_progress_artifact(12.5, key=key)  # a final figure after the close

    final = finish()
    engine.dispose()
    assert creators == [threading.main_thread().name]  # never the publisher
    latest = Artifact.get(key)
    assert latest is not None and latest.id == final and float(str(latest.data)) == 12.5


def test_a_result_storage_block_that_does_not_load_fails_the_run_in_one_line_before_paying(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in EPISODIC_RESULT_STORAGE fails the flow with the same one line `episodic
    prefect setup` gives (not Prefect's own three-error chain), before any item is claimed
    or paid."""
    monkeypatch.setenv("EPISODIC_RESULT_STORAGE", "local-file-system/no-such-block")
    plan(harness, episode, tmp_path / "p", ["a", "b"])
    state = generate_episode(episode_id=episode, return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "EPISODIC_RESULT_STORAGE: block 'local-file-system/no-such-block' does not load" in (
        message
    ), message
    assert [e for e in provider_log() if e["event"] == "job_created"] == []


def test_a_media_store_that_cannot_be_written_fails_the_flow_in_one_line_before_any_client(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generate flow probes the media store after the episode gate and before the
    provider is built: no client (so no credential read), no job, no run."""
    missing = tmp_path / "no-such-media"
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(missing))
    plan(harness, episode, tmp_path / "p", ["a", "b"])
    state = generate_episode(episode_id=episode, return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert f"media store {missing}: no such folder" in message, message
    assert provider_log() == []  # not even `client_built`
    engine = create_engine(harness)
    with engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
    engine.dispose()


@pytest.mark.parametrize("prefect_path", [False, True], ids=["python-api", "flow"])
def test_buying_a_cancelled_job_anew_keeps_to_the_per_run_cap_on_both_paths(
    harness: str, episode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_path: bool
) -> None:
    """Run A's accepted job, kept at A's cancel for run B, is cancelled at the provider by a
    second cancel of A once B has failed (no live run includes it). Generating again would
    buy the item anew, but one more image is above the per-run cap (EPISODIC_MAX_RUN_COST,
    no --max-cost or --max-images given): the item fails and nothing is bought, through the
    Python API and through the flow alike. (The flow built its options apart and its item
    tasks ran without the cap: they bought the item again.) Counted at the fake provider."""
    from episodic.core.planning import RunOptions
    from episodic.core.settings import load_settings
    from episodic.core.states import RunState
    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate
    from episodic.pipeline.runner import new_owner
    from episodic.providers.base import ImageRequest
    from episodic.providers.fake import FakeProvider
    from episodic.storage.claims import ClaimStore
    from episodic.storage.engine import make_engine
    from episodic.storage.leases import LeaseStore
    from episodic.storage.ledger import LedgerStore
    from episodic.storage.models import ItemRow
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    engine = make_engine(harness)
    plan(harness, episode, tmp_path / "p", ["only [[DELAY_MS:4000]]"])
    live = Episode(engine, episode)
    store = RunStore(engine)
    run_a = new_run(live)
    store.transition_run(run_a, RunState.RUNNING)
    with engine.connect() as conn:
        (pk,) = conn.execute(select(ItemRow.id)).scalars()
    claims = ClaimStore(engine)
    claim = claims.claim(pk, run_a, new_owner(), lease_s=30, max_attempts=3, profile="fake")
    assert isinstance(claim, Claim) and claim.submission is not None
    provider = FakeProvider(
        profile_id="fake", state_dir=load_settings().home_path / "fake-provider"
    )
    item = claim.item
    remote = provider.submit(
        ImageRequest(claim.submission.client_reference, "e", item.item_id, item.prompt, item.seed)
    )
    assert LedgerStore(engine).accept(claim.submission.pk, remote)
    LeaseStore(engine).release(claim, "interrupted")  # A's process stopped; its job stays accepted
    run_b = new_run(live)  # B: another live run includes the item
    _state, kept = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [j.kept_for for j in kept] == [run_b]
    store.transition_run(run_b, RunState.RUNNING, lease_s=30)
    store.transition_run(run_b, RunState.FAILED, "holder died (swept)")
    _state, again = cancel_run(engine, load_settings(), run_a, EnvironmentCredentials())
    assert [(j.remote_ref, j.answer) for j in again] == [(remote, "canceled")]
    monkeypatch.setenv("EPISODIC_MAX_RUN_COST", "0.01")  # one image costs 0.04
    if prefect_path:
        state = generate_episode(episode_id=episode, return_state=True)
        assert state.is_failed(), state.message
    else:
        outcome = generate(
            engine, load_settings(), "weekly", episode, RunOptions(), EnvironmentCredentials()
        )
        assert outcome.counts.failed == 1, outcome.message
    engine.dispose()
    assert list(jobs_per_key().values()) == [1]  # nothing bought anew
