"""Durable before done: a paid image is proven, stored and verified before it is completed.

Counted from the provider's side (the fake's own log, the HTTP server's jobs and downloads)
and from the store's (what it holds under each key), on SQLite and PostgreSQL: a download
that is not an image is downloaded again and then fails its item with the charge recorded;
a store that cannot take a paid image leaves its job accepted and stops the run's buying
(`test_store_stops_buying.py`), and the next run collects it at no cost; a store that
cannot be written refuses the run before the provider is called or its credential read.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine, text

from episodic.core.errors import CommandNotAllowed, MediaStoreMisconfigured
from episodic.core.exit_codes import ExitCode
from episodic.core.planning import RunOptions
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.generation import OnStart, generate
from episodic.pipeline.outcomes import RunOutcome
from episodic.pipeline.paid_call import DOWNLOAD_ATTEMPTS
from episodic.pipeline.runner import Runner
from episodic.providers.fake import render_png
from episodic.providers.profiles import Profile
from tests.fs_faults import can_mount, read_only_folder, tiny_filesystem
from tests.generation import (
    Episode,
    image_keys,
    jobs_per_key,
    new_episode,
    provider_log,
    write_playlist,
)
from tests.http_server import TOKEN, PredictionsServer
from tests.s3_server import S3Server, running_s3_server


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def episode(engine: Engine, database_url: str) -> Episode:
    return new_episode(engine)


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql)).all()]


def _collects() -> int:
    return sum(1 for e in provider_log() if e["event"] == "collect")


class CredentialSpy:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, profile: Profile) -> str:
        self.reads.append(profile.id)
        return TOKEN


# ------------------------------------------------------------------ not an image, not done
@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("html", "an HTML page"),
        ("truncated", "truncated"),
        ("gif", "a GIF image"),
        ("empty", "an empty body"),
    ],
)
def test_a_download_that_is_not_an_image_fails_the_item_with_its_charge_and_names_the_job(
    episode: Episode, tmp_path: Path, kind: str, what: str
) -> None:
    episode.plan(write_playlist(tmp_path / "p", [f"bad [[OUTPUT:{kind}]]", "good"]))
    outcome = episode.generate(collect_timeout_s=30)  # never waited for: not an image
    assert outcome.exit_code == ExitCode.PARTIAL and outcome.counts.completed == 1
    assert sorted(jobs_per_key().values()) == [1, 1]  # one job each, never bought again
    assert _collects() == DOWNLOAD_ATTEMPTS + 1  # downloaded again, then given up
    ((state, error, ref),) = _rows(
        episode.engine,
        "SELECT state, error_text, remote_ref FROM submissions WHERE state <> 'succeeded'",
    )
    assert state == "failed" and what in str(error) and f"job {ref}" in str(error)
    assert _rows(episode.engine, "SELECT sum(amount_micros) FROM cost_entries") == [(80_000,)]
    items = _rows(episode.engine, "SELECT state, output_key, error_text FROM items ORDER BY id")
    assert [(s, k is None) for s, k, _ in items] == [("failed", True), ("completed", False)]
    assert what in str(items[0][2])
    assert len(image_keys(episode.engine)) == 1  # only the good image is in the store


def test_a_download_that_decodes_on_a_later_try_completes_with_one_job(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["flaky cdn [[OUTPUT:html:2]]"]))
    assert episode.generate().exit_code == ExitCode.OK
    assert list(jobs_per_key().values()) == [1] and _collects() == 3
    ((_key, _sha, _size, media_type),) = image_keys(episode.engine)
    assert media_type == "image/png"


@pytest.mark.parametrize(("kind", "extension"), [("jpeg", "jpg"), ("webp", "webp")])
def test_a_jpeg_or_webp_is_stored_with_its_own_type_and_extension(
    episode: Episode, tmp_path: Path, kind: str, extension: str
) -> None:
    episode.plan(write_playlist(tmp_path / "p", [f"other type [[OUTPUT:{kind}]]"]))
    assert episode.generate().exit_code == ExitCode.OK
    ((key, _sha, _size, media_type),) = image_keys(episode.engine)
    assert media_type == f"image/{kind}" and key.endswith(f".{extension}")
    assert _collects() == 1


@pytest.fixture
def http_episode(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Episode, PredictionsServer]]:
    with PredictionsServer() as server:
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(
            "profiles:\n  http-test:\n    kind: http\n"
            f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
            "    cost_per_image_minor: 5\n    max_concurrency: 4\n    timeout_s: 1\n"
            "    poll_interval_s: 0.05\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        yield new_episode(engine), server


def _downloads(server: PredictionsServer) -> int:
    return sum(1 for seen in server.requests if "/files/" in seen.path)


def _as(kind: str) -> bytes:
    out = io.BytesIO()
    with Image.open(io.BytesIO(render_png("x", 1))) as image:
        image.convert("RGB").save(out, format=kind)
    return out.getvalue()


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"<html><body>503 Service Unavailable</body></html>", "an HTML page"),
        (render_png("x", 1)[:200], "truncated"),
        (_as("GIF"), "a GIF image"),
        (b"", "an empty body"),
    ],
    ids=["html", "truncated", "gif", "empty"],
)
def test_an_http_provider_answering_what_is_not_an_image_is_charged_once_and_fails(
    http_episode: tuple[Episode, PredictionsServer], tmp_path: Path, body: bytes, what: str
) -> None:
    episode, server = http_episode
    server.reply = lambda kind, path: (200, body) if kind == "file" else None
    episode.plan(write_playlist(tmp_path / "p", ["a"], profile="http-test"))
    # an empty 200 is not an image either: failed at once, never polled until the deadline
    assert episode.generate(collect_timeout_s=30).exit_code == ExitCode.RUN_FAILED
    assert list(server.jobs_made.values()) == [1]
    assert _downloads(server) == DOWNLOAD_ATTEMPTS
    ((state, error),) = _rows(episode.engine, "SELECT state, error_text FROM submissions")
    job = next(iter(server.jobs))
    assert state == "failed" and what in str(error) and job in str(error)
    assert _rows(episode.engine, "SELECT sum(amount_micros) FROM cost_entries") == [(50_000,)]
    assert _rows(episode.engine, "SELECT state, output_key FROM items") == [("failed", None)]


@pytest.mark.parametrize(("kind", "extension"), [("JPEG", "jpg"), ("WEBP", "webp")])
def test_an_http_provider_answering_a_jpeg_or_webp_is_stored_as_that_type(
    http_episode: tuple[Episode, PredictionsServer], tmp_path: Path, kind: str, extension: str
) -> None:
    episode, server = http_episode
    body = _as(kind)
    server.reply = lambda k, path: (200, body) if k == "file" else None
    episode.plan(write_playlist(tmp_path / "p", ["a"], profile="http-test"))
    assert episode.generate().exit_code == ExitCode.OK
    ((key, _sha, size, media_type),) = image_keys(episode.engine)
    assert media_type == f"image/{kind.lower()}" and key.endswith(f".{extension}")
    assert size == len(body) and _downloads(server) == 1


# ------------------------------------------------------- a store outage never buys again
def _generate_with(episode: Episode, on_start: OnStart) -> RunOutcome:
    return generate(
        episode.engine,
        load_settings(),
        "weekly",
        episode.episode_id,
        RunOptions(),
        EnvironmentCredentials(),
        on_start=on_start,
    )


def _fill(folder: Path) -> None:
    """Write until the filesystem is full (ENOSPC)."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()


@pytest.mark.skipif(not can_mount(), reason="a full disk needs a tmpfs (root)")
def test_a_full_disk_after_the_providers_success_leaves_the_job_accepted_and_resume_collects(
    episode: Episode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tiny_filesystem(tmp_path / "tiny", size_kib=256) as folder:
        monkeypatch.setenv("EPISODIC_MEDIA_URL", str(folder))
        episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
        # the probe passed (the run was built); the disk fills before any image is written
        outcome = _generate_with(episode, lambda runner, run_id: _fill(folder))
        # it stopped buying at the first image not stored (those in flight were bought)
        assert outcome.exit_code == ExitCode.INTERRUPTED and outcome.state == RunState.PAUSED
        bought = jobs_per_key()
        assert set(bought.values()) == {1} and len(bought) <= 3
        subs = _rows(episode.engine, "SELECT state, remote_ref FROM submissions")
        assert len(subs) == len(bought)
        assert {s for s, _ in subs} == {"accepted"} and all(ref for _, ref in subs)
        errors = _rows(episode.engine, "SELECT state, output_key, error_text FROM items")
        assert {(s, k) for s, k, _ in errors} <= {("failed", None), ("pending", None)}
        assert any("not stored yet" in str(e) for *_, e in errors)
        assert all("not stored yet" in str(e) or e in ("interrupted", None) for *_, e in errors)
        assert _rows(episode.engine, "SELECT count(*) FROM cost_entries") == [(0,)]
        (folder / "filler").unlink()  # the disk has room again
        again = episode.resume(outcome.run_id)
        assert again.exit_code == ExitCode.OK and again.state == RunState.COMPLETED
        assert sorted(jobs_per_key().values()) == [1, 1, 1]  # collected, never bought again
        assert len(image_keys(episode.engine)) == 3
        assert _rows(episode.engine, "SELECT sum(amount_micros) FROM cost_entries") == [(120_000,)]


def test_an_s3_store_that_stops_after_the_providers_success_is_collected_again_at_no_cost(
    episode: Episode, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 server goes away (its process stopped) once the run is built, then comes back
    (a new process on the same port, with the bucket made again)."""
    server = S3Server(tmp_path / "own-s3").start()
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        bucket = server.new_bucket()
        monkeypatch.setenv("EPISODIC_MEDIA_URL", f"s3://{bucket}/media")
        episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
        marker: list[bytes] = []  # the store's identity, kept as a real outage keeps objects

        def outage(runner: Runner, run_id: str) -> None:
            reply = server.client().get_object(Bucket=bucket, Key="media/episodic-store.json")
            marker.append(reply["Body"].read())
            server.stop()

        outcome = _generate_with(episode, outage)
        assert outcome.exit_code == ExitCode.INTERRUPTED  # it stopped buying
        bought = jobs_per_key()
        assert set(bought.values()) == {1} and len(bought) <= 2
        assert {s for (s,) in _rows(episode.engine, "SELECT state FROM submissions")} == {
            "accepted"
        }
        server.start()
        server.client().create_bucket(Bucket=bucket)  # moto forgot it all: put back the
        server.put_behind_the_store(bucket, "media/episodic-store.json", marker[0])  # marker
        again = episode.resume(outcome.run_id)
        assert again.exit_code == ExitCode.OK
        assert sorted(jobs_per_key().values()) == [1, 1]
        assert len(image_keys(episode.engine)) == 2
    finally:
        server.stop()


# ------------------------------------------------------------ fail closed before spending
def test_a_store_that_cannot_be_written_refuses_before_any_credential_read_or_call(
    http_episode: tuple[Episode, PredictionsServer],
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    episode, server = http_episode
    episode.plan(write_playlist(tmp_path / "p", ["a"], profile="http-test"))
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    spy = CredentialSpy()

    def attempt(url: str) -> str:
        monkeypatch.setenv("EPISODIC_MEDIA_URL", url)
        with pytest.raises((MediaStoreMisconfigured, CommandNotAllowed)) as caught:
            generate(
                episode.engine, load_settings(), "weekly", episode.episode_id, RunOptions(), spy
            )
        assert caught.value.exit_code == ExitCode.REFUSED
        return str(caught.value)

    missing = attempt("s3://no-such-bucket-here/media")
    assert "s3://no-such-bucket-here/media" in missing and "no such bucket" in missing
    with read_only_folder(tmp_path / "ro") as folder:
        read_only = attempt(str(folder))
    assert str(folder) in read_only
    assert "no such folder" in attempt(str(tmp_path / "nowhere"))
    with running_s3_server(tmp_path / "auth-s3") as checking:  # a server checking signatures
        bucket = checking.new_bucket()
        key_id, secret = checking.make_access_key(bucket)
        checking.enforce_auth()
        for name, value in checking.env(key_id, "wrong-" + secret).items():
            monkeypatch.setenv(name, value)
        wrong = attempt(f"s3://{bucket}/media")
    assert f"s3://{bucket}/media" in wrong and "wrong credentials" in wrong
    assert secret not in wrong and key_id not in wrong
    for message in (missing, read_only, wrong):
        assert "\n" not in message and TOKEN not in message
    assert spy.reads == []  # the provider's credential was never read
    assert not server.create_calls and not server.requests  # nor the provider asked
    assert _rows(episode.engine, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.slow
def test_a_kill_9_after_the_providers_success_and_before_the_ledger_write_never_buys_again(
    episode: Episode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `episodic generate` whose S3 store is frozen (SIGSTOP) once the provider made
    its first job: its collected images cannot be written, and it is killed (kill -9) while
    it waits. Then the store comes back and `episodic retry` collects the same jobs."""
    import signal
    import subprocess
    import time

    from tests.acceptance.conftest import EPISODIC
    from tests.generation import generate_in_background, made_jobs_per_key, until_jobs

    items = 4
    monkeypatch.setenv("EPISODIC_LEASE_S", "5")
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "200")
    server = S3Server(tmp_path / "crash-s3").start()
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EPISODIC_MEDIA_URL", f"s3://{server.new_bucket()}/media")
        episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(items)]))
        process = generate_in_background(episode.episode_id, "--concurrency", "2")
        until_jobs(process, 1)  # the probe passed long before: the run is paying
        server.freeze()
        deadline = time.monotonic() + 60
        while _collects() < 1:  # the provider's success is in this process's hands
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no job was collected"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        assert _rows(episode.engine, "SELECT count(*) FROM items WHERE state = 'completed'") == [
            (0,)
        ]
        paid_before = sum(made_jobs_per_key().values())
        assert paid_before >= 1
        server.resume()
        assert EPISODIC is not None
        retried = subprocess.run(
            [EPISODIC, "retry", episode.episode_id], capture_output=True, text=True, timeout=300
        )
        assert retried.returncode == 0, retried.stderr
        made = made_jobs_per_key()
        assert len(made) == items and set(made.values()) == {1}  # one job per item, ever
        assert len(image_keys(episode.engine)) == items
    finally:
        server.stop()


def test_the_cli_refuses_a_store_that_cannot_be_written_in_one_line_exit_2(
    episode: Episode, tmp_path: Path
) -> None:
    import os
    import subprocess

    from tests.acceptance.conftest import EPISODIC

    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    assert EPISODIC is not None
    missing = tmp_path / "no-such-media"
    env = {**os.environ, "EPISODIC_MEDIA_URL": str(missing)}
    done = subprocess.run(
        [EPISODIC, "generate", episode.episode_id],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == ExitCode.REFUSED, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(missing) in lines[0] and "no such folder" in lines[0]
    assert provider_log() == []  # no client built, no call made
    assert _rows(episode.engine, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.parametrize(
    ("kind", "output", "media_type"),
    [
        ("replicate", "webp", "image/webp"),
        ("fal", "jpeg", "image/jpeg"),
        ("replicate", "html", ""),
        ("replicate", "empty", ""),
        ("fal", "empty", ""),
    ],
)
def test_replicate_webp_and_fal_jpeg_are_kept_as_they_are_and_html_is_not_an_image(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    output: str,
    media_type: str,
) -> None:
    """Replicate's default output is WEBP and fal's JPEG: each is stored under its own type
    and extension, never called ``.png``; an HTML page from the output host fails the item
    after three downloads of the one job."""
    from tests.jobs_servers import TOKEN as JOBS_TOKEN
    from tests.jobs_servers import FalServer, ReplicateServer

    kinds = {"replicate": ReplicateServer, "fal": FalServer}
    with kinds[kind](output_format=output) as server:
        model = "black-forest-labs/flux-schnell" if kind == "replicate" else "fal-ai/flux/dev"
        (tmp_path / "providers.yaml").write_text(
            f"profiles:\n  real:\n    kind: {kind}\n    model: {model}\n"
            f"    base_url: {server.base_url}\n    credential_env: IMAGE_KEY\n"
            "    cost_per_image_minor: 3\n    timeout_s: 2.0\n    poll_interval_s: 0.02\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
        monkeypatch.setenv("IMAGE_KEY", JOBS_TOKEN)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a"], profile="real"))
        outcome = episode.generate(collect_timeout_s=30)
        assert list(server.jobs_made.values()) == [1]
        if not media_type:
            assert outcome.exit_code == ExitCode.RUN_FAILED
            ((state, error),) = _rows(engine, "SELECT state, error_text FROM submissions")
            what = "an empty body" if output == "empty" else "an HTML page"
            assert state == "failed" and what in str(error)
            assert _rows(engine, "SELECT sum(amount_micros) FROM cost_entries") == [(30_000,)]
            return
        assert outcome.exit_code == ExitCode.OK
        ((key, _sha, _size, stored_type),) = image_keys(engine)
        assert stored_type == media_type and key.endswith("." + output.replace("jpeg", "jpg"))
