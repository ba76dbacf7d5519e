"""`episodic media import`: rows from before the media store (an absolute path on the
machine that paid) become store keys, every hash verified, nothing paid; idempotent.

Legacy rows are made as a pre-0013 database holds them: a generated episode's images are
copied to files under the old episode folder, its rows point at those files, and the store
forgets the objects. Each test runs on SQLite and Postgres; the store tests on a local
folder and on moto's S3 server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.media import content_key
from episodic.core.settings import load_settings
from episodic.pipeline.check import check_episodes
from episodic.pipeline.media_import import import_legacy_media
from episodic.storage.media import MediaStore
from tests.generation import Episode, image_keys, jobs_per_key, new_episode, write_playlist
from tests.integration.test_media_restore import Store, store  # noqa: F401  (the fixture)


def _make_legacy(episode: Episode, target: Store, folder: Path) -> list[Path]:
    """Turn the episode's completed images into legacy rows: the bytes in files under
    `folder`, the rows naming them by absolute path, no key; the store forgets them."""
    media = MediaStore.from_settings(load_settings())
    files = []
    with episode.engine.begin() as conn:
        rows = conn.execute(
            text("SELECT id, output_key FROM items WHERE state = 'completed' ORDER BY id")
        ).all()
        for pk, key in rows:
            path = folder / f"v{pk}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(media.read(key))
            conn.execute(
                text(
                    "UPDATE items SET output_path = :p, output_key = NULL, output_size = NULL, "
                    "output_media_type = NULL WHERE id = :pk"
                ),
                {"p": str(path.absolute()), "pk": pk},
            )
            target.delete_behind(key)
            files.append(path)
    return files


def _legacy_columns(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT output_key, output_path FROM items WHERE state = 'completed' "
                    "ORDER BY id"
                )
            )
        ]


def test_legacy_images_move_into_the_store_verified_and_a_second_run_does_nothing(
    engine: Engine,
    store: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    episode.generate()
    files = _make_legacy(episode, store, tmp_path / "old-home" / "episodes" / "images")
    assert all(key is None for key, _ in _legacy_columns(engine))
    assert check_episodes(engine, "weekly", episode.episode_id) == []  # clean before
    jobs_before = jobs_per_key()

    report = import_legacy_media(engine, load_settings())

    assert [(f.what, f.status) for f in report.files] == [
        ("image v01.p1", "imported"),
        ("image v02.p1", "imported"),
        ("image v03.p1", "imported"),
    ]
    assert report.complete and report.store == MediaStore.from_settings(load_settings()).describe()
    keys = image_keys(engine)  # no path left; the store holds each recorded sha256
    for (key, sha, size, media_type), path in zip(keys, files, strict=True):
        content = path.read_bytes()  # legacy files are kept
        assert sha == hashlib.sha256(content).hexdigest() and size == len(content)
        assert key == content_key(sha, "image/png") and media_type == "image/png"
    assert check_episodes(engine, "weekly", episode.episode_id) == []  # clean after
    assert jobs_per_key() == jobs_before  # nothing bought

    again = import_legacy_media(engine, load_settings())
    assert again.files == [] and again.complete
    assert image_keys(engine) == keys


def test_a_missing_or_changed_legacy_file_is_reported_and_the_others_imported(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    episode.generate()
    files = _make_legacy(episode, Store("local", None), tmp_path / "old")
    files[0].unlink()  # that machine's disk is gone
    files[1].write_bytes(files[2].read_bytes())  # another image where this one was
    before = _legacy_columns(engine)

    report = import_legacy_media(engine, load_settings())

    found = {f.what: (f.status, f.detail) for f in report.files}
    assert found["image v01.p1"] == ("missing", "no such file on this machine")
    assert found["image v02.p1"][0] == "differs" and "left as it is" in found["image v02.p1"][1]
    assert found["image v03.p1"][0] == "imported" and not report.complete
    after = _legacy_columns(engine)
    assert after[:2] == before[:2]  # untouched: still their legacy paths, no key
    assert after[2][0] is not None and after[2][1] is None
    assert [f.what for f in import_legacy_media(engine, load_settings()).files] == [
        "image v01.p1",
        "image v02.p1",
    ]  # the imported one is done; the others are reported again


def test_an_episodes_legacy_cover_and_manifest_are_imported(
    engine: Engine,
    store: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    from tests.integration.test_media_store import image_bytes

    episode = new_episode(engine)
    folder = tmp_path / "old" / episode.episode_id
    folder.mkdir(parents=True)
    cover, manifest = folder / "cover.png", folder / "manifest.json"
    cover.write_bytes(image_bytes())
    manifest.write_text(json.dumps({"episode_id": episode.episode_id}))
    with engine.begin() as conn:
        pk = conn.execute(
            text("SELECT id FROM episodes WHERE episode_id = :e"), {"e": episode.episode_id}
        ).scalar_one()
        for kind, path in (("cover", cover), ("manifest", manifest)):
            conn.execute(
                text(
                    "INSERT INTO episode_media (episode_pk, kind, path, sha256, recorded_at) "
                    "VALUES (:pk, :kind, :path, :sha, CURRENT_TIMESTAMP)"
                ),
                {
                    "pk": pk,
                    "kind": kind,
                    "path": str(path),
                    "sha": hashlib.sha256(path.read_bytes()).hexdigest(),
                },
            )

    report = import_legacy_media(engine, load_settings())

    assert [(f.what, f.status) for f in report.files] == [
        ("cover", "imported"),
        ("manifest", "imported"),
    ]
    media = MediaStore.from_settings(load_settings())
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, key, sha256, size, media_type, path FROM episode_media ORDER BY kind"
            )
        ).all()
    expected = {"cover": ("image/png", cover), "manifest": ("application/json", manifest)}
    for kind, key, sha, size, media_type, path in rows:
        wanted_type, legacy = expected[kind]
        assert path is None and media_type == wanted_type
        assert key == content_key(sha, wanted_type) and size == legacy.stat().st_size
        assert media.read(key) == legacy.read_bytes()
    assert import_legacy_media(engine, load_settings()).files == []


def test_restore_imports_legacy_files_still_here_and_collects_the_lost_one_again(
    engine: Engine,
    store: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A legacy row whose file this machine no longer has (it was on the machine that
    paid) is collected again from its job by `media restore`; the others are imported from
    their files. No job is made."""
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.restore import restore

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    episode.generate()
    files = _make_legacy(episode, store, tmp_path / "old")
    files[1].unlink()
    jobs_before = jobs_per_key()

    report = restore(
        engine, load_settings(), "weekly", episode.episode_id, EnvironmentCredentials()
    )

    assert [(i.item_id, i.status) for i in report.items] == [
        ("v01.p1", "imported"),
        ("v02.p1", "restored"),
        ("v03.p1", "imported"),
    ]
    assert report.collected == 1 and jobs_per_key() == jobs_before
    assert len(image_keys(engine)) == 3  # every row a key, no path; the store holds each
    assert import_legacy_media(engine, load_settings()).files == []
    assert check_episodes(engine, "weekly", episode.episode_id) == []
