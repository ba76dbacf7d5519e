"""The media store's identity, recorded on both sides (storage.store_identity): a machine
configured with another store than the database records is refused before it reads, buys
or writes anything, and "wrong store" is never read as "images lost".

Each test runs on SQLite and Postgres, and where a store is involved on a local folder and
a real S3-compatible server (moto, its own process). Money is counted at the provider's side
(the fake provider's own log of the jobs it made).
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.errors import WrongMediaStore
from episodic.core.settings import load_settings
from episodic.pipeline.check import check_episodes
from episodic.pipeline.generation import writable_store
from episodic.storage.media import MARKER, MediaStore
from episodic.storage.store_identity import marker_id, recorded
from tests.generation import Episode, image_keys, jobs_per_key, new_episode, write_playlist
from tests.integration.media_workers import adopt_worker
from tests.media_targets import MediaTarget, media, open_target

__all__ = ["media"]


@pytest.fixture(autouse=True)
def provider_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _episodic(*args: str) -> subprocess.CompletedProcess[str]:
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    return subprocess.run(
        [EPISODIC, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300
    )


def _generated(engine: Engine, tmp_path: Path, key: str = "test:1") -> Episode:
    episode = new_episode(engine, key)
    episode.plan(write_playlist(tmp_path / key.replace(":", "-"), ["a", "b", "c"]))
    assert episode.generate().counts.completed == 3
    return episode


def _other_store(media: MediaTarget, tmp_path: Path, name: str) -> str:
    """Another store of the same kind: a sibling folder, or another prefix of the bucket."""
    if media.kind == "local":
        folder = tmp_path / name
        folder.mkdir()
        return str(folder)
    return f"s3://{media.bucket}/{name}"


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_the_first_writing_command_adopts_its_store_on_both_sides(
    engine: Engine, media: MediaTarget, tmp_path: Path
) -> None:
    assert recorded(engine) is None
    _generated(engine, tmp_path)
    store = media.store()
    marker = json.loads(media.read_behind(MARKER))
    assert recorded(engine) is not None
    assert recorded(engine) == type(recorded(engine))(marker["store_id"], store.describe())
    assert "created" in marker


def test_a_typo_in_the_store_prefix_is_refused_and_buy_again_buys_nothing(
    engine: Engine, media: MediaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episode = _generated(engine, tmp_path)
    right = media.store().describe()
    typo = _other_store(media, tmp_path, "medai")
    before, submissions = jobs_per_key(), _count(engine, "submissions")
    monkeypatch.setenv("EPISODIC_MEDIA_URL", typo)

    refused = _episodic(
        "media", "restore", episode.episode_id, "--buy-again", "--yes", "--collect-timeout", "1"
    )

    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and refused.stdout == ""
    typo_shown = MediaStore.open(typo).describe()
    assert f"the configured media store {typo_shown} is not this database's recorded" in line
    assert f"recorded store {right} (it has no marker" in line
    assert "set EPISODIC_MEDIA_URL to the recorded one" in line
    assert f"`episodic media import --from {right}`; nothing was bought" in line
    assert jobs_per_key() == before and _count(engine, "submissions") == submissions
    assert _count(engine, "lost_outputs") == 0
    assert MediaStore.open(typo).read_marker() is None  # the wrong store was not adopted
    for command in (["check", episode.episode_id], ["episodes", "show", episode.episode_id]):
        also = _episodic(*command)
        assert also.returncode == 2 and "is not this database's recorded store" in also.stderr
    monkeypatch.setenv("EPISODIC_MEDIA_URL", media.url)  # the right store: all is there
    assert check_episodes(engine, "weekly", episode.episode_id) == []


def test_a_second_machine_on_its_default_local_store_cannot_generate(
    engine: Engine,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Machine A generated into S3; machine B shares the database with EPISODIC_MEDIA_URL
    unset (its default folder in its own state folder): refused before any provider call."""
    s3 = open_target("s3", request, tmp_path, monkeypatch)
    _generated(engine, tmp_path)
    second = new_episode(engine, "test:2")
    second.plan(write_playlist(tmp_path / "second", ["d", "e"]))
    before, submissions = jobs_per_key(), _count(engine, "submissions")
    monkeypatch.delenv("EPISODIC_MEDIA_URL")
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "machine-b"))

    refused = _episodic("generate", second.episode_id)

    assert refused.returncode == 2, refused.stdout + refused.stderr
    local = str(tmp_path / "machine-b" / "media")
    assert f"store {local} is not this database's recorded store {s3.url}" in refused.stderr
    assert "nothing was bought" in refused.stderr
    assert jobs_per_key() == before and _count(engine, "submissions") == submissions
    assert not any(p.is_file() for p in (tmp_path / "machine-b" / "media").rglob("sha256/*"))


def test_import_from_the_recorded_store_moves_to_the_configured_one(
    engine: Engine, media: MediaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episode = _generated(engine, tmp_path)
    keys = [key for key, *_ in image_keys(engine)]
    old = media.store().describe()
    new_url = _other_store(media, tmp_path, "moved")
    monkeypatch.setenv("EPISODIC_MEDIA_URL", new_url)
    with pytest.raises(WrongMediaStore):
        writable_store(load_settings(), engine)
    wrong_source = _episodic("media", "import", "--from", new_url)
    assert wrong_source.returncode == 2 and "is not this database's" in wrong_source.stderr

    moved = _episodic("media", "import", "--from", media.url, "--json")

    assert moved.returncode == 0, moved.stdout + moved.stderr
    answer = json.loads(moved.stdout)
    new_store = MediaStore.open(new_url)
    assert answer["moved"] and answer["counts"] == {"copied": len(keys)}
    assert answer["source"] == old and answer["store"] == new_store.describe()
    have = recorded(engine)
    assert have is not None and have.url == new_store.describe()
    assert have.store_id == marker_id(new_store) != marker_id(media.store())
    assert check_episodes(engine, "weekly", episode.episode_id) == []  # all in the new store
    monkeypatch.setenv("EPISODIC_MEDIA_URL", media.url)  # the old store is now the wrong one
    with pytest.raises(WrongMediaStore):
        writable_store(load_settings(), engine)


def test_an_upgraded_database_adopts_only_a_store_that_holds_its_images(
    engine: Engine, media: MediaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completed images and no recorded store (a database from before 0015)."""
    _generated(engine, tmp_path)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM media_store"))
    media.delete_behind(MARKER)  # and a store from before the marker
    monkeypatch.setenv("EPISODIC_MEDIA_URL", _other_store(media, tmp_path, "empty"))
    with pytest.raises(WrongMediaStore, match="does not hold this database's images"):
        writable_store(load_settings(), engine)
    assert recorded(engine) is None

    monkeypatch.setenv("EPISODIC_MEDIA_URL", media.url)
    store = writable_store(load_settings(), engine)
    have = recorded(engine)
    assert have is not None and have.store_id == marker_id(store)


@pytest.mark.parametrize("stores", ["one", "two"])
def test_two_processes_racing_adopt_one_store(
    engine: Engine, database_url: str, media: MediaTarget, tmp_path: Path, stores: str
) -> None:
    """Two processes released together adopt a store for a fresh database: the same store
    is recorded once with one marker; two different stores: one is adopted, the other
    refused."""
    urls = [media.url, media.url if stores == "one" else _other_store(media, tmp_path, "b")]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=adopt_worker, args=(barrier, database_url, url, results)) for url in urls
    ]
    for proc in procs:
        proc.start()
    answers = sorted(results.get(timeout=180) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    have = recorded(engine)
    assert have is not None and _count(engine, "media_store") == 1
    if stores == "one":
        assert [kind for kind, *_ in answers] == ["ok", "ok"], answers
        assert {answer[2] for answer in answers} == {have.store_id}
        assert marker_id(media.store()) == have.store_id
        return
    assert [kind for kind, *_ in answers] == ["ok", "refused"], answers
    (_, won, store_id), (_, lost, why) = answers
    assert store_id == have.store_id == marker_id(MediaStore.open(won))
    assert "is not this database's recorded store" in why
    assert MediaStore.open(lost).describe() in why


def test_a_store_that_lost_its_marker_is_read_on_and_marked_again_after_a_sample_check(
    engine: Engine, media: MediaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker of the recorded store is deleted, every image still there. Commands that
    only read go on (with a note, and a `check` finding); one that would buy is refused in
    one line naming the store once and `episodic media restore-marker`; that command refuses
    while a sampled object is not the recorded bytes, then writes the recorded store's
    marker again (the same store id), after which everything works and nothing is bought
    twice. At another address it is refused, naming both stores."""
    episode = _generated(engine, tmp_path)
    have = recorded(engine)
    assert have is not None
    url = media.store().describe()
    media.delete_behind(MARKER)
    before, submissions = jobs_per_key(), _count(engine, "submissions")

    shown = _episodic("episodes", "show", episode.episode_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [m["stored"] for m in json.loads(shown.stdout)["media"]] == ["yes"] * 3
    assert "restore-marker" in shown.stderr
    checked = _episodic("check", "--all")
    assert checked.returncode == 8 and "restore-marker" in checked.stdout, checked.stdout
    refused = _episodic("media", "restore", episode.episode_id)  # it would write
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.count(url) == 1, line  # named once: it is the recorded store
    assert "`episodic media restore-marker`" in line and "import --from" not in line, line

    key, *_ = image_keys(engine)[1]
    good = media.read_behind(key)
    media.write_behind(key, b"not the paid bytes")
    tampered = _episodic("media", "restore-marker", "--sample", "3")
    assert tampered.returncode == 2, tampered.stdout + tampered.stderr
    (line,) = tampered.stderr.strip().splitlines()
    assert "1 of 3 sampled" in line and key in line and "nothing was written" in line, line
    assert media.store().read_marker() is None
    media.write_behind(key, good)

    elsewhere = _other_store(media, tmp_path, "elsewhere")
    monkeypatch.setenv("EPISODIC_MEDIA_URL", elsewhere)
    wrong = _episodic("media", "restore-marker")
    assert wrong.returncode == 2 and url in wrong.stderr, wrong.stderr
    assert MediaStore.open(elsewhere).describe() in wrong.stderr
    assert MediaStore.open(elsewhere).read_marker() is None
    monkeypatch.setenv("EPISODIC_MEDIA_URL", media.url)

    restored = _episodic("media", "restore-marker", "--json")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    answer = json.loads(restored.stdout)
    assert answer["written"] and answer["sampled"] == answer["recorded_objects"] == 3, answer
    assert marker_id(media.store()) == have.store_id  # the same store, as recorded
    again = _episodic("media", "restore-marker")
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout
    assert _episodic("check", "--all").returncode == 0
    done = _episodic("generate", episode.episode_id, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["paid_submissions"] == 0
    assert jobs_per_key() == before and _count(engine, "submissions") == submissions


_NOT_MARKERS: list[bytes | str] = [b"", b"\x00\xff\x89PNG", b"[]", b'{"id": 1}']


@pytest.mark.parametrize(
    ("kind", "content"),
    [("local", "a folder")]  # an object store holds objects only: no folder stands at a key
    + [(kind, content) for kind in ("local", "s3") for content in _NOT_MARKERS],
)
def test_a_marker_that_is_not_one_is_refused_with_the_way_on_and_left_as_it_is(
    engine: Engine,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    content: str | bytes,
) -> None:
    """Something else where the store's marker is (a folder, an empty or binary file, JSON
    without a store id): every command that would write, `media restore-marker` among them,
    is refused in one line that says what is there and the way on (move it out, then
    restore-marker), never a loop back to itself; nothing deletes it. Moved out, that command
    writes the recorded store's marker again."""
    from episodic.cli.app import run

    media = open_target(kind, request, tmp_path, monkeypatch)
    episode = _generated(engine, tmp_path)
    have = recorded(engine)
    assert have is not None
    media.delete_behind(MARKER)
    if content == "a folder":
        (Path(media.url) / MARKER).mkdir()
    else:
        assert isinstance(content, bytes)
        media.write_behind(MARKER, content)
    capsys.readouterr()
    for argv in (["media", "restore-marker"], ["media", "restore", episode.episode_id]):
        assert run(argv) == 2, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "is not a store marker" in line and "move it out of the store" in line, line
        assert line.count("restore-marker") == 1, line
    if content == "a folder":
        assert (Path(media.url) / MARKER).is_dir()
        (Path(media.url) / MARKER).rmdir()  # the operator moves it out
    else:
        assert media.read_behind(MARKER) == content
        media.delete_behind(MARKER)
    assert run(["media", "restore-marker"]) == 0
    assert marker_id(media.store()) == have.store_id
