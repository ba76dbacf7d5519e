"""`episodic media restore`: completed images the media store lost or damaged come back from
the provider's recorded jobs, verified, and nothing is paid.

Each store test runs on a local folder and on a real S3-compatible server (moto's, on
loopback), on SQLite and Postgres. "Nothing paid" is counted on the provider's side: the
fake provider's own log (jobs it made) and the HTTP server's job and create counts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.errors import EpisodeNotFound, MediaStoreMisconfigured
from episodic.core.settings import load_settings
from episodic.pipeline.check import check_episodes
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.restore import RestoreReport, restore
from episodic.providers.profiles import Profile
from episodic.storage.media import MediaStore
from tests.generation import (
    Episode,
    image_keys,
    jobs_per_key,
    new_episode,
    provider_log,
    write_playlist,
)
from tests.http_server import TOKEN, PredictionsServer
from tests.s3_server import S3Server

KINDS = ["local", "s3"]


class Store:
    """The media store of this test's environment, and a way around it to its objects."""

    def __init__(self, kind: str, server: S3Server | None, bucket: str = "") -> None:
        self.kind, self.server, self.bucket = kind, server, bucket

    def open(self) -> MediaStore:
        return MediaStore.from_settings(load_settings())

    def delete_behind(self, key: str) -> None:
        if self.server is None:
            (Path(self.open().describe()) / key).unlink()
        else:
            self.server.client().delete_object(Bucket=self.bucket, Key=f"media/{key}")

    def write_behind(self, key: str, body: bytes) -> None:
        if self.server is None:
            (Path(self.open().describe()) / key).write_bytes(body)
        else:
            self.server.put_behind_the_store(self.bucket, f"media/{key}", body)


@pytest.fixture(params=KINDS)
def store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Store]:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    if request.param == "local":
        yield Store("local", None)
        return
    server: S3Server = request.getfixturevalue("s3_server")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    bucket = server.new_bucket()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", f"s3://{bucket}/media")
    yield Store("s3", server, bucket)


def _restore(episode: Episode, collect_timeout_s: float = 60.0) -> RestoreReport:
    return restore(
        episode.engine,
        load_settings(),
        "weekly",
        episode.episode_id,
        EnvironmentCredentials(),
        collect_timeout_s=collect_timeout_s,
    )


def _rows(engine: Engine) -> list[tuple[str, str, int, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT output_key, output_sha256, output_size, output_media_type, output_path "
                "FROM items WHERE state = 'completed' ORDER BY id"
            )
        ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def test_lost_and_damaged_images_come_back_from_their_jobs_and_nothing_is_paid(
    engine: Engine, store: Store, tmp_path: Path
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    assert episode.generate().counts.completed == 3
    keys = [key for key, *_ in image_keys(engine)]
    rows_before = _rows(engine)
    store.delete_behind(keys[0])  # lost
    store.write_behind(keys[1], b"not the image we paid for")  # damaged behind our back
    assert check_episodes(engine, "weekly", episode.episode_id)  # check sees both
    jobs_before = jobs_per_key()

    report = _restore(episode)

    assert [(i.item_id, i.status) for i in report.items] == [
        ("v01.p1", "restored"),
        ("v02.p1", "restored"),
        ("v03.p1", "present"),
    ]
    assert report.complete and report.collected == 2 and report.paid_calls == 0
    assert jobs_per_key() == jobs_before and set(jobs_before.values()) == {1}  # no new job
    assert [e["event"] for e in provider_log()].count("collect") == 3 + 2  # downloads only
    assert _rows(engine) == rows_before  # the same evidence: key, sha256, size, type
    assert [key for key, *_ in image_keys(engine)] == keys  # the store holds them again
    assert check_episodes(engine, "weekly", episode.episode_id) == []

    again = _restore(episode)  # nothing left to do
    assert {i.status for i in again.items} == {"present"} and again.collected == 0


def test_a_missing_episode_or_an_unwritable_store_is_refused_before_any_client_is_built(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refuse:
        def read(self, profile: Profile) -> str:
            raise AssertionError("a credential was read")

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    with pytest.raises(EpisodeNotFound, match="2026-W32-7 not found"):
        restore(engine, load_settings(), "weekly", "2026-W32-7", Refuse())
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    episode.generate()
    built = len([e for e in provider_log() if e["event"] == "client_built"])
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(tmp_path / "no-such-folder"))
    with pytest.raises(MediaStoreMisconfigured, match="no such folder"):
        restore(engine, load_settings(), "weekly", episode.episode_id, Refuse())
    assert len([e for e in provider_log() if e["event"] == "client_built"]) == built


@pytest.fixture
def http_episode(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Episode, PredictionsServer]]:
    with PredictionsServer() as server:
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(
            "profiles:\n"
            "  http-test:\n"
            "    kind: http\n"
            f"    base_url: {server.base_url}\n"
            "    credential_env: TEST_IMAGE_TOKEN\n"
            "    cost_per_image_minor: 5\n"
            "    max_concurrency: 4\n"
            "    timeout_s: 1\n"
            "    poll_interval_s: 0.05\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="http-test"))
        assert episode.generate().counts.completed == 3
        yield episode, server


def test_over_http_a_job_no_longer_served_or_serving_other_bytes_is_reported_not_stored(
    http_episode: tuple[Episode, PredictionsServer], tmp_path: Path
) -> None:
    """The provider forgot one job (its polls answer 404), and another's output changed:
    the first is `not_served`, the second `differs` and is refused (the recorded sha256 is
    the evidence of what was paid for); the third comes back. No create reaches the
    server, and no job is made."""
    episode, server = http_episode
    keys = [key for key, *_ in image_keys(episode.engine)]
    store = MediaStore.from_settings(load_settings())
    for key in keys:
        (Path(store.describe()) / key).unlink()
    rows_before = _rows(episode.engine)
    jobs = list(server.jobs)  # in creation order; map them to items by their prompt
    by_title = {server.jobs[j]["prompt"].split(" ")[2]: j for j in jobs}
    del server.jobs[by_title["a"]]  # the provider no longer serves it
    server.jobs[by_title["b"]]["seed"] += 1  # its output is other bytes now
    creates, made = sum(server.create_calls.values()), sum(server.jobs_made.values())

    report = _restore(episode, collect_timeout_s=1.0)

    statuses = {i.item_id: (i.status, i.detail) for i in report.items}
    assert statuses["v01.p1"][0] == "not_served" and "HTTP 404" in statuses["v01.p1"][1]
    assert (
        statuses["v02.p1"][0] == "differs" and "the recorded image stands" in statuses["v02.p1"][1]
    )
    assert statuses["v03.p1"][0] == "restored"
    assert not report.complete and report.paid_calls == 0
    assert report.not_served_cost() == {"USD": 50_000}  # the one it cannot restore, as bought
    assert (sum(server.create_calls.values()), sum(server.jobs_made.values())) == (creates, made)
    assert _rows(episode.engine) == rows_before  # nothing rewritten
    assert not store.exists(keys[0]) and not store.exists(keys[1]) and store.exists(keys[2])
    assert hashlib.sha256(store.read(keys[2])).hexdigest() == rows_before[2][1]


def test_when_every_image_is_present_no_credential_is_read_and_the_provider_is_not_asked(
    http_episode: tuple[Episode, PredictionsServer],
) -> None:
    class Refuse:
        def read(self, profile: Profile) -> str:
            raise AssertionError("a credential was read")

    episode, server = http_episode
    requests_before = len(server.requests)
    report = restore(episode.engine, load_settings(), "weekly", episode.episode_id, Refuse())
    assert {i.status for i in report.items} == {"present"} and report.collected == 0
    assert len(server.requests) == requests_before
