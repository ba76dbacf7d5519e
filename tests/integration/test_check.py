"""The read-only checker on SQLite and Postgres."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, select, text, update
from sqlalchemy.engine import make_url

from episodic.core.settings import load_settings
from episodic.pipeline.approval import decide
from episodic.pipeline.assembly import assemble
from episodic.pipeline.check import check_episodes, legacy_warnings
from episodic.storage.admission import DedupPolicy
from episodic.storage.engine import make_engine
from episodic.storage.media import MediaStore
from episodic.storage.models import CostEntryRow, EpisodeMediaRow, EpisodeRow, ItemRow
from tests.generation import Episode, new_episode, write_playlist
from tests.media_targets import MediaTarget


@pytest.fixture
def assembled(engine: Engine, database_url: str, tmp_path: Path) -> Episode:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    episode.generate()
    decide(engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)
    assemble(engine, load_settings(), "weekly", episode.episode_id)
    return episode


def read_only_engine(database_url: str, request: pytest.FixtureRequest) -> Engine:
    """SQLite: mode=ro on a file without write permission; Postgres: a SELECT-only role."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        path = Path(str(url.database))
        os.chmod(path, 0o444)
        request.addfinalizer(lambda: os.chmod(path, 0o644))
        return make_engine(database_url, read_only=True)
    role = f"episodic_ro_{uuid.uuid4().hex[:8]}"
    admin = make_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    admin.dispose()

    def drop() -> None:
        cleanup = make_engine(database_url)
        with cleanup.begin() as conn:
            conn.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}"))
            conn.execute(text(f"DROP OWNED BY {role}"))
        cleanup.dispose()
        other = make_engine(url.set(database="postgres").render_as_string(hide_password=False))
        with other.begin() as conn:
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        other.dispose()

    request.addfinalizer(drop)
    return make_engine(url.set(username=role).render_as_string(hide_password=False), read_only=True)


def test_clean_data_passes_read_only_and_nothing_is_written(
    assembled: Episode, database_url: str, request: pytest.FixtureRequest
) -> None:
    home = load_settings().home_path
    files = sorted(p for p in home.rglob("*") if p.is_file())
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files}
    ro = read_only_engine(database_url, request)
    assert check_episodes(ro, "weekly") == []
    assert check_episodes(ro, "weekly", assembled.episode_id) == []
    ro.dispose()
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files}
    assert after == before
    assert sorted(p for p in home.rglob("*") if p.is_file()) == files


@pytest.fixture
def assembled_in(media: MediaTarget, engine: Engine, tmp_path: Path) -> Episode:
    """An assembled episode whose images, cover and manifest are in `media`."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    episode.generate()
    decide(engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)
    assemble(engine, load_settings(), "weekly", episode.episode_id)
    return episode


def _media_keys(engine: Engine) -> tuple[list[str], dict[str, str]]:
    with engine.connect() as conn:
        images = list(conn.execute(select(ItemRow.output_key).order_by(ItemRow.id)).scalars())
        media = dict(conn.execute(select(EpisodeMediaRow.kind, EpisodeMediaRow.key)).all())
    assert all(images) and set(media) == {"cover", "manifest"}
    return [str(key) for key in images], {k: str(v) for k, v in media.items()}


def test_media_missing_tampered_or_not_an_image_are_found_in_the_store(
    assembled_in: Episode, media: MediaTarget
) -> None:
    """Behind the store's back: an image deleted, one rewritten, one replaced by an HTML page
    whose hash and size the row records (a download completed before images were proven),
    the cover rewritten and the manifest deleted. Each is a finding naming its key."""
    engine = assembled_in.engine
    assert check_episodes(engine, "weekly") == []
    (first, second, third), kinds = _media_keys(engine)
    media.delete_behind(first)
    media.write_behind(second, b"not the image we paid for")
    html = b"<!doctype html><html><body>503 Service Unavailable</body></html>"
    media.write_behind(third, html)
    with engine.begin() as conn:
        conn.execute(
            update(ItemRow)
            .where(ItemRow.output_key == third)
            .values(output_sha256=hashlib.sha256(html).hexdigest(), output_size=len(html))
        )
    media.write_behind(kinds["cover"], b"x")
    media.delete_behind(kinds["manifest"])
    details = [f"{f.check}: {f.detail}" for f in check_episodes(engine, "weekly")]
    store = media.store().describe()
    assert (
        f"files: image v01.p1 is missing from the media store: {first} in the media "
        f"store {store}" in details
    ), details
    assert any(
        d.startswith("files: image v02.p1 does not match its recorded size") and second in d
        for d in details
    ), details
    assert any(
        d.startswith("files: image v03.p1 does not decode as a PNG, JPEG or WEBP image")
        and third in d
        for d in details
    ), details
    assert any(d.startswith("files: cover does not match its recorded size") for d in details)
    assert any(d.startswith("files: manifest is missing from the media store") for d in details)
    assert len([d for d in details if d.startswith("files:")]) == 5, details
    media.write_behind(second, b"not the image we paid for, but of the recorded size.")
    with engine.begin() as conn:  # the same size, other bytes
        conn.execute(
            update(ItemRow)
            .where(ItemRow.output_key == second)
            .values(output_size=len(b"not the image we paid for, but of the recorded size."))
        )
    details = [f"{f.check}: {f.detail}" for f in check_episodes(engine, "weekly")]
    assert any(
        d.startswith("files: image v02.p1 does not match its recorded sha256") for d in details
    )


def test_a_legacy_row_is_checked_on_its_file_and_warned_about(
    assembled: Episode, tmp_path: Path
) -> None:
    """A row from before the store (a local path, no key) is read from that file: clean
    while the file is as paid for, a finding once it is not; `legacy_warnings` says it
    should be imported into the store (a warning: the exit code stays 0)."""
    engine = assembled.engine
    with engine.connect() as conn:
        key, sha256 = conn.execute(
            select(ItemRow.output_key, ItemRow.output_sha256).order_by(ItemRow.id).limit(1)
        ).one()
    legacy = tmp_path / "legacy-image.png"
    legacy.write_bytes(MediaStore.from_settings(load_settings()).read(key))
    with engine.begin() as conn:
        conn.execute(
            update(ItemRow)
            .where(ItemRow.output_key == key)
            .values(
                output_key=None, output_size=None, output_media_type=None, output_path=str(legacy)
            )
        )
    assert check_episodes(engine, "weekly") == []
    [warning] = legacy_warnings(engine, "weekly")
    assert warning.check == "legacy-media" and "1 images" in warning.detail
    assert "`episodic media import`" in warning.detail
    legacy.write_bytes(b"tampered")
    details = [f"{f.check}: {f.detail}" for f in check_episodes(engine, "weekly")]
    assert details == [f"files: image v01.p1 does not match its recorded sha256: {legacy}"]
    legacy.unlink()
    details = [f"{f.check}: {f.detail}" for f in check_episodes(engine, "weekly")]
    assert details == [f"files: image v01.p1 is missing: {legacy}"]
    assert sha256  # the recorded hash is what the file was compared with


def test_a_ledger_mismatch_is_found(assembled: Episode) -> None:
    with assembled.engine.begin() as conn:
        conn.execute(
            delete(CostEntryRow).where(
                CostEntryRow.id
                == select(CostEntryRow.id).order_by(CostEntryRow.id).limit(1).scalar_subquery()
            )
        )
    findings = check_episodes(assembled.engine, "weekly")
    assert [f.check for f in findings] == ["ledger"]
    assert "0 cost entries, expected 1" in findings[0].detail


def test_a_reopened_episode_is_not_reported_as_a_crash(engine: Engine, assembled: Episode) -> None:
    """After `reopen` the episode is allocated with every image of its plan completed: it
    waits for a new plan, and `check` does not call that a crash nor advise marking it
    generated."""
    from episodic.pipeline.approval import reopen

    reopen(engine, "weekly", assembled.episode_id, by="ann", reason="new cover")
    assert check_episodes(engine, "weekly") == []


def test_an_episode_that_completes_after_it_was_listed_is_checked_as_it_is_now(
    engine: Engine, tmp_path: Path
) -> None:
    """`check --all` lists the episodes, then checks each in a snapshot of its own. An
    episode listed while allocated whose run then completed, marked it generated and ended
    was checked by its listed row: every image completed, no live run, still allocated,
    so "a crash before it was marked" (seen in CI with two generates beside a check loop).
    The episode, its plan and its approval are read in the same snapshot as the rest."""
    from episodic.pipeline.check import _check_one
    from episodic.pipeline.check_media import MediaAudit

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b"]))
    with engine.connect() as conn:
        listed = conn.execute(
            select(EpisodeRow).where(EpisodeRow.episode_id == episode.episode_id)
        ).one()
    assert listed.state == "allocated"
    assert episode.generate().state.value == "completed"
    store = MediaAudit(MediaStore.from_settings(load_settings()))
    assert _check_one(engine, listed, DedupPolicy(), store) == []


def test_check_while_generations_run_reports_nothing(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """`check` in a loop while two healthy `episodic generate` processes work on one episode
    (no faults): every finding would be a false alarm. Items, submissions and costs read in
    separate statements would, on PostgreSQL, make an item read before its completion and
    its submission read after look like a broken ledger; and an episode whose last image has
    just completed would look like a crash before the run could mark it. So one snapshot per
    episode, and a live run is left to mark it."""
    import subprocess
    import sys

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", [f"live {n}" for n in range(40)]))
    episodic = str(Path(sys.executable).parent / "episodic")
    env = {**os.environ, "EPISODIC_FAKE_DELAY_MS": "100", "EPISODIC_HOME": str(tmp_path / "h")}
    runs = [
        subprocess.Popen(
            [episodic, "generate", episode.episode_id, "--concurrency", "8", *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra in ([], ["--allow-duplicate"])
    ]
    store = MediaStore.open(str(tmp_path / "h" / "media"), create=True)  # the processes' store
    found, checks = [], 0
    while any(run.poll() is None for run in runs):
        checks += 1
        found += check_episodes(engine, "weekly", store=store)
    assert [run.wait() for run in runs] == [0, 0], [run.stderr.read() for run in runs if run.stderr]
    assert checks > 5
    assert found == []
    assert check_episodes(engine, "weekly", store=store) == []


def test_a_dead_runs_liveness_line_names_its_last_renewal_and_its_expiry(
    engine: Engine, tmp_path: Path
) -> None:
    """A running run whose process died: the line does not give the lease's expiry (a lease,
    about 30 s, after the true last renewal) as "no renewal since T". It names both, as
    recorded: when the lease expired, and when a process last renewed it."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from episodic.core.states import RunState
    from episodic.storage.models import RunRow
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a"]))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=30)
    renewed = datetime(2026, 8, 3, 9, 0, 5, tzinfo=UTC)
    expired = datetime(2026, 8, 3, 9, 0, 35, tzinfo=UTC)
    with engine.begin() as conn:  # its process renewed once at 09:00:05, then was killed
        conn.execute(
            update(RunRow)
            .where(RunRow.id == run_id)
            .values(heartbeat_at=renewed, lease_expires_at=expired)
        )
    [line] = [f.detail for f in check_episodes(engine, "weekly") if f.check == "liveness"]
    assert "its lease expired at 2026-08-03 09:00:35 UTC" in line, line
    assert "last renewed 2026-08-03 09:00:05 UTC" in line, line
    assert "since 2026-08-03 09:00:35" not in line, line  # the expiry is not a renewal
    with engine.begin() as conn:  # a row from before leases were recorded
        conn.execute(update(RunRow).where(RunRow.id == run_id).values(lease_expires_at=None))
    [line] = [f.detail for f in check_episodes(engine, "weekly") if f.check == "liveness"]
    assert "no lease is recorded and its last sign of life was 2026-08-03 09:00:05 UTC" in line
