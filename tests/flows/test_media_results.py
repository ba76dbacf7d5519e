"""Prefect results next to the media: with a remote media store, `episodic prefect setup`
saves a RemoteFileSystem block on the same URL (under ``prefect-results/``), the flows write
their item results there, and a flow run on another machine (another state folder, the same
database and bucket) finds them: a cache hit, no provider call.

Real parts: Prefect's test harness (a real API server), moto's S3 server on loopback, the
fake provider's log."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from episodic.flows.generate import generate_episode
from episodic.tasks.generate import generate_item
from tests.flows.test_generate_flow import plan
from tests.generation import provider_log, submissions_per_item
from tests.s3_server import S3Server

pytestmark = pytest.mark.slow


@pytest.fixture
def episode(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from sqlalchemy import create_engine

    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    engine = create_engine(harness)
    allocated = allocate(engine, "weekly", WeekId.parse("2026-W32"), f"k-{tmp_path.name}")
    engine.dispose()
    return str(allocated.episode.episode_id)


@pytest.fixture
def s3_media(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """EPISODIC_MEDIA_URL on a fresh bucket of the S3 server; returns the bucket."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.new_bucket()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", f"s3://{bucket}/media")
    return bucket


def _result_objects(server: S3Server, bucket: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix="media/prefect-results/")
    return [entry["Key"] for entry in listed.get("Contents", [])]


def test_setup_saves_the_media_stores_result_block_idempotently(
    harness: str, s3_media: str
) -> None:
    from prefect.blocks.core import Block
    from prefect.filesystems import RemoteFileSystem

    from episodic.core.settings import load_settings
    from episodic.deployments.setup import prefect_setup
    from episodic.tasks.results import media_results, result_storage

    shared = media_results(load_settings())
    assert shared is not None and shared.basepath == f"s3://{s3_media}/media/prefect-results"
    first = prefect_setup()
    assert first["result_storage"] == f"{shared.slug} ({shared.basepath})"
    block = Block.load(shared.slug)
    assert isinstance(block, RemoteFileSystem) and block.basepath == shared.basepath
    assert block.settings == {}  # no credential in the block: s3fs reads the AWS variables
    assert prefect_setup() == first  # again: the same block, as it was
    assert Block.load(shared.slug)._block_document_id == block._block_document_id
    RemoteFileSystem(basepath=shared.basepath, settings={"anon": False}).save(
        shared.name, overwrite=True
    )  # an option set on the block by its owner stays
    assert prefect_setup() == first
    assert Block.load(shared.slug).settings == {"anon": False}
    RemoteFileSystem(basepath="s3://elsewhere/x").save(shared.name, overwrite=True)
    prefect_setup()  # a block on another basepath is put right
    assert Block.load(shared.slug).basepath == shared.basepath
    assert result_storage(load_settings()) == shared.slug


def test_an_explicit_result_storage_setting_wins_over_the_media_store(
    harness: str, s3_media: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.settings import load_settings
    from episodic.tasks.results import result_storage

    monkeypatch.setenv("EPISODIC_RESULT_STORAGE", "local-file-system/ours")
    assert result_storage(load_settings()) == "local-file-system/ours"
    monkeypatch.delenv("EPISODIC_RESULT_STORAGE")
    monkeypatch.setenv("EPISODIC_MEDIA_URL", "/srv/media")  # a local store: a local folder
    assert result_storage(load_settings()) == load_settings().results_path


def test_without_setup_a_flow_run_fails_in_one_line_naming_the_command_before_paying(
    harness: str, s3_media: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a"])
    state = generate_episode(episode_id=episode, return_state=True)
    assert state.is_failed()
    assert "saved by `episodic prefect setup`" in str(state.message), state.message
    assert [e for e in provider_log() if e["event"] == "job_created"] == []


def test_a_flow_run_on_another_machine_finds_the_results_in_the_media_store(
    harness: str,
    s3_media: str,
    s3_server: S3Server,
    episode: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from episodic.core.settings import load_settings
    from episodic.deployments.setup import prefect_setup
    from episodic.tasks.results import result_storage

    prefect_setup()
    plan(harness, episode, tmp_path / "p", ["a", "b"])
    result = generate_episode(episode_id=episode)
    assert result["state"] == "completed" and set(submissions_per_item().values()) == {1}
    assert len(_result_objects(s3_server, s3_media)) >= 2
    local = load_settings().results_path
    assert not local.exists() or not [f for f in local.rglob("*") if f.is_file()]
    events_before = len(provider_log())

    # another machine: its own, empty state folder; the same database, bucket and server
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "machine-b"))
    key, ledger = _first_item(harness)

    @flow
    def elsewhere() -> object:
        item = generate_item.with_options(result_storage=result_storage(load_settings()))
        work = {"item_pk": -1, "owner": "no-owner"}  # never read: the cache answers
        return item(work, "v01.p1", key, ledger, return_state=True)

    state = elsewhere()
    assert state.name == "Cached"
    assert state.result() == key
    assert len(provider_log()) == events_before


def _first_item(url: str) -> tuple[str, str]:
    from episodic.storage.engine import make_engine
    from episodic.storage.installation import installation_id
    from episodic.storage.runs import RunStore
    from episodic.tasks.generate import ledger_ref

    engine = make_engine(url)
    store = RunStore(engine)
    (run,) = store.list_runs("weekly")
    item = next(i for i in store.run_items(run.run_id) if i.item_id == "v01.p1")
    scope = installation_id(engine)
    engine.dispose()
    return item.idempotency_key, ledger_ref(scope, item)
