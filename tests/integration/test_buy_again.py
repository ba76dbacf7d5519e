"""`episodic media restore E --buy-again`: an image the store lost and the provider no longer
serves is bought again as a normal paid call (a run: admission, claims, ledger, caps); the
ones the provider still serves are restored free in the same command.

On SQLite and Postgres. Money is counted on the provider's side: the fake provider's own
log (jobs it made, per item key) and the HTTP server's jobs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from episodic.core.errors import BudgetExceeded, CommandNotAllowed
from episodic.core.planning import RunOptions
from episodic.core.settings import load_settings
from episodic.pipeline.approval import decide, reopen
from episodic.pipeline.buy_again import BuyAgainReport, Quote, buy_again
from episodic.pipeline.check import check_episodes
from episodic.pipeline.gate import EnvironmentCredentials
from tests.generation import (
    Episode,
    image_keys,
    jobs_per_key,
    new_episode,
    store_file,
    write_playlist,
)
from tests.http_server import TOKEN, PredictionsServer
from tests.media_targets import MediaTarget


@pytest.fixture(autouse=True)
def provider_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _generated(engine: Engine, tmp_path: Path, titles: list[str] | None = None) -> Episode:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", titles or ["a", "b", "c"]))
    assert episode.generate().counts.completed == len(titles or "abc")
    return episode


def _lose(
    engine: Engine, video_id: str, *, job_too: bool, media: MediaTarget | None = None
) -> tuple[str, str]:
    """The store loses `video_id`'s image (deleted behind the store of `media`, or of the
    default local folder); with `job_too` the fake provider forgets its job (no longer
    served). (key, sha256) of what was lost."""
    with engine.connect() as conn:
        key, sha, ref = conn.execute(
            text(
                "SELECT i.output_key, i.output_sha256, s.remote_ref FROM items i JOIN "
                "submissions s ON s.item_pk = i.id AND s.state = 'succeeded' "
                "WHERE i.video_id = :v AND i.state = 'completed'"
            ),
            {"v": video_id},
        ).one()
    if media is not None:
        media.delete_behind(key)
    else:
        store_file(key).unlink()
    if job_too:
        (Path(os.environ["EPISODIC_HOME"]) / "fake-provider" / f"{ref}.json").unlink()
    return key, sha


def _buy(
    episode: Episode,
    answer: bool = True,
    quotes: list[Quote] | None = None,
    **options: Any,
) -> BuyAgainReport:
    def confirm(quote: Quote) -> bool:
        (quotes if quotes is not None else []).append(quote)
        return answer

    settings = load_settings()
    return buy_again(
        episode.engine,
        settings,
        "weekly",
        episode.episode_id,
        EnvironmentCredentials(),
        RunOptions(cap_micros=settings.max_run_cost_micros, **options),
        confirm,
        collect_timeout_s=1.0,
    )


def _ledger(engine: Engine, video_id: str) -> list[tuple[str, int | None]]:
    """(state, cost) of each submission of `video_id`'s item, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.state, c.amount_micros FROM submissions s JOIN items i "
                "ON i.id = s.item_pk LEFT JOIN cost_entries c ON c.submission_pk = s.id "
                "WHERE i.video_id = :v ORDER BY s.id"
            ),
            {"v": video_id},
        ).all()
    return [(row[0], row[1]) for row in rows]


def _lost_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text("SELECT key, sha256, reason, lost_at FROM lost_outputs ORDER BY id")
            ).all()
        ]


def _state(engine: Engine, episode_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT state FROM episodes WHERE episode_id = :e"), {"e": episode_id}
            ).scalar_one()
        )


def test_only_what_the_provider_no_longer_serves_is_bought_and_check_stays_clean(
    engine: Engine, tmp_path: Path, media: MediaTarget
) -> None:
    """On both stores: the local folder and a bucket of the S3 server."""
    episode = _generated(engine, tmp_path)
    lost_key, lost_sha = _lose(engine, "v01", job_too=True, media=media)  # gone there too
    _lose(engine, "v02", job_too=False, media=media)  # the provider still serves it: free
    before = jobs_per_key()
    quotes: list[Quote] = []

    report = _buy(episode, quotes=quotes)

    statuses = {i.item_id: i.status for i in report.restore.items}
    assert statuses == {"v01.p1": "not_served", "v02.p1": "restored", "v03.p1": "present"}
    assert [(q.items, q.price_micros, q.total_micros, q.currency) for q in quotes] == [
        (["v01.p1"], quotes[0].price_micros, quotes[0].price_micros, "USD")
    ]
    assert report.lost == ["v01.p1"] and report.outcome is not None
    assert report.outcome.exit_code == 0 and report.complete
    after = jobs_per_key()
    bought = [key for key in after if after[key] != before[key]]
    assert len(bought) == 1 and after[bought[0]] == 2  # one new job, for v01 only
    assert sum(after.values()) == sum(before.values()) + 1
    # the old paid call stays succeeded with its cost; a new one is bought
    price = quotes[0].price_micros
    assert _ledger(engine, "v01") == [("succeeded", price), ("succeeded", price)]
    [(key, sha, reason, lost_at)] = _lost_rows(engine)
    assert (key, sha) == (lost_key, lost_sha) and lost_at is not None
    assert "--buy-again" in reason
    assert len(image_keys(engine)) == 3  # every completed image is in the store again
    assert check_episodes(engine, "weekly", episode.episode_id) == []
    assert _state(engine, episode.episode_id) == "generated"
    # a second command finds everything in place: nothing asked, nothing bought
    again = _buy(episode, quotes=quotes)
    assert again.quote is None and again.outcome is None and len(quotes) == 1
    assert jobs_per_key() == after


def test_not_confirmed_or_above_a_cap_nothing_is_bought_or_written(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episode = _generated(engine, tmp_path)
    _lose(engine, "v01", job_too=True)
    _lose(engine, "v02", job_too=True)
    before = jobs_per_key()
    with pytest.raises(CommandNotAllowed, match="not confirmed"):
        _buy(episode, answer=False)
    with pytest.raises(BudgetExceeded, match="--max-images 1"):
        _buy(episode, max_images=1)  # the cap counts the two re-bought items
    with pytest.raises(BudgetExceeded, match="--max-cost"):
        _buy(episode, max_cost_micros=1)
    monkeypatch.setenv("EPISODIC_MAX_RUN_COST", "0.01")
    with pytest.raises(BudgetExceeded, match="EPISODIC_MAX_RUN_COST"):
        _buy(episode)
    assert jobs_per_key() == before and _lost_rows(engine) == []
    assert _state(engine, episode.episode_id) == "generated"
    monkeypatch.delenv("EPISODIC_MAX_RUN_COST")
    report = _buy(episode, max_images=2)
    assert report.complete and sum(jobs_per_key().values()) == sum(before.values()) + 2
    assert check_episodes(engine, "weekly", episode.episode_id) == []


def test_an_approved_episode_is_refused_naming_reopen_then_bought_after_it(
    engine: Engine, tmp_path: Path
) -> None:
    episode = _generated(engine, tmp_path)
    decide(engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)
    _lose(engine, "v01", job_too=True)
    before = jobs_per_key()
    with pytest.raises(CommandNotAllowed) as refused:
        _buy(episode)
    assert f"episodic reopen {episode.episode_id} --by NAME --reason TEXT" in str(refused.value)
    assert jobs_per_key() == before and _lost_rows(engine) == []
    reopen(engine, "weekly", episode.episode_id, by="ann", reason="v01 lost")
    report = _buy(episode)
    assert report.complete and sum(jobs_per_key().values()) == sum(before.values()) + 1
    assert _state(engine, episode.episode_id) == "generated"  # to be decided again
    assert check_episodes(engine, "weekly", episode.episode_id) == []


def _race_worker(barrier: Any, url: str, home: str, episode_id: str, results: Any) -> None:
    import traceback

    os.environ["EPISODIC_DATABASE_URL"], os.environ["EPISODIC_HOME"] = url, home
    try:
        from episodic.storage.engine import make_engine

        barrier.wait(timeout=120)
        report = _buy(Episode(make_engine(url), episode_id))
        results.put(["ok", report.complete])
    except Exception:
        results.put(["error", traceback.format_exc(limit=5)])


def test_two_processes_racing_buy_each_lost_image_once(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    episode = _generated(engine, tmp_path, ["a", "b", "c", "d"])
    for video in ("v01", "v02", "v03"):
        _lose(engine, video, job_too=True)
    before = jobs_per_key()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_race_worker,
            args=(barrier, database_url, os.environ["EPISODIC_HOME"], episode.episode_id, results),
        )
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    answers = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert all(kind == "ok" for kind, _ in answers), answers
    after = jobs_per_key()
    assert sum(after.values()) == sum(before.values()) + 3  # one new job per lost item
    assert sorted(after.values()) == [1, 2, 2, 2]
    assert len(_lost_rows(engine)) == 3  # each loss recorded once
    assert check_episodes(engine, "weekly", episode.episode_id) == []


def test_over_http_an_expired_output_is_bought_again_with_one_job(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer() as server:
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(
            "profiles:\n  http-test:\n    kind: http\n"
            f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
            "    cost_per_image_minor: 5\n    timeout_s: 1\n    poll_interval_s: 0.05\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b"], profile="http-test"))
        assert episode.generate().counts.completed == 2
        for key, *_ in image_keys(engine):
            store_file(key).unlink()
        by_title = {job["prompt"].split(" ")[2]: j for j, job in server.jobs.items()}
        server.expired.add(by_title["a"])  # polls succeeded, its file answers 410
        made = sum(server.jobs_made.values())
        quotes: list[Quote] = []

        report = _buy(episode, quotes=quotes)

        statuses = {i.item_id: i.status for i in report.restore.items}
        assert statuses == {"v01.p1": "not_served", "v02.p1": "restored"}
        assert [(q.items, q.total_micros) for q in quotes] == [(["v01.p1"], 50_000)]
        assert sum(server.jobs_made.values()) == made + 1  # one job, for v01
        assert report.complete and report.outcome is not None
        assert report.outcome.counts.cost_micros >= 50_000
        assert check_episodes(engine, "weekly", episode.episode_id) == []


def test_the_command_refuses_without_yes_off_a_terminal(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    episode = _generated(engine, tmp_path)
    _lose(engine, "v01", job_too=True)
    before = jobs_per_key()
    command = [EPISODIC, "media", "restore", episode.episode_id, "--collect-timeout", "1"]
    refused = subprocess.run(
        [*command, "--buy-again"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert refused.returncode == 2, refused.stderr
    assert "--yes" in refused.stderr and "nothing was bought" in refused.stderr
    assert jobs_per_key() == before and _lost_rows(engine) == []
    done = subprocess.run([*command, "--buy-again", "--yes"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "buying 1 image of" in done.stderr and "v01.p1" in done.stderr
    assert "bought again:" in done.stdout and "v01.p1: not served" in done.stdout
    assert sum(jobs_per_key().values()) == sum(before.values()) + 1
    assert check_episodes(engine, "weekly", episode.episode_id) == []
    again = subprocess.run(
        [*command, "--buy-again", "--json"], capture_output=True, text=True, check=True
    )
    answer = json.loads(again.stdout)  # nothing left to buy: nothing asked, nothing paid
    assert answer["complete"] and answer["buy_again"] is None and answer["paid_calls"] == 0
    assert answer["run"] is None and answer["counts"] == {"present": 3}


def test_a_loss_recorded_by_a_command_that_died_is_quoted_and_bought_by_the_next(
    engine: Engine, tmp_path: Path
) -> None:
    """The state after step 2 (recorded lost, not bought: a kill between the two) is
    consistent for `check`, and the next `--buy-again` quotes, asks for and buys it once."""
    from episodic.storage.media_records import MediaRecords

    episode = _generated(engine, tmp_path)
    _lose(engine, "v02", job_too=True)
    records = MediaRecords(engine)
    with engine.connect() as conn:
        episode_pk = conn.execute(
            text("SELECT id FROM episodes WHERE episode_id = :e"), {"e": episode.episode_id}
        ).scalar_one()
    lost = [image for image in records.images(episode_pk) if image.item_id == "v02.p1"]
    assert records.lose(episode_pk, lost, "test: the command died next").item_pks
    assert _state(engine, episode.episode_id) == "allocated"
    assert check_episodes(engine, "weekly", episode.episode_id) == []
    before = jobs_per_key()
    quotes: list[Quote] = []

    report = _buy(episode, quotes=quotes)

    assert [q.items for q in quotes] == [["v02.p1"]] and report.lost in (None, [])
    assert report.complete and sum(jobs_per_key().values()) == sum(before.values()) + 1
    assert _state(engine, episode.episode_id) == "generated"
    assert check_episodes(engine, "weekly", episode.episode_id) == []


def test_a_buy_again_killed_with_kill_9_is_taken_over_and_finished_by_the_next_command(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `media restore E --buy-again --yes` killed (kill -9) while its new jobs run at
    the provider; after its leases expired, the next command takes its run over and
    finishes it: one new job per lost image (counted at the provider), `check` clean, and
    its line says how many images were pending instead of "every image is in the store"."""
    import signal
    import time

    from tests.acceptance.conftest import EPISODIC
    from tests.generation import made_jobs_per_key

    assert EPISODIC is not None
    lease_s = 5
    monkeypatch.setenv("EPISODIC_LEASE_S", str(lease_s))
    episode = _generated(engine, tmp_path, ["a", "b", "c", "d"])
    lost = ["v01", "v02", "v03"]
    for video in lost:
        _lose(engine, video, job_too=True)
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "3000")
    command = [EPISODIC, "media", "restore", episode.episode_id, "--buy-again", "--yes"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while sum(jobs_per_key().values()) < 4 + len(lost):  # the new jobs run at the provider
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the buy-again made no progress"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    time.sleep(lease_s + 1)  # its leases expire (a wait, not an assertion)

    second = subprocess.run(command, capture_output=True, text=True, timeout=300)

    assert second.returncode == 0, (second.stdout, second.stderr)
    assert "every image is in the store" not in second.stdout, second.stdout
    assert f"{len(lost)} images pending" in second.stdout, second.stdout
    made = made_jobs_per_key()  # the lost jobs' files are gone: one file per job since
    assert len(made) == 4 and set(made.values()) == {1}, made
    assert sum(jobs_per_key().values()) == 4 + len(lost)  # one new job per lost image
    assert check_episodes(engine, "weekly", episode.episode_id) == []
    assert len(image_keys(engine)) == 4 and _state(engine, episode.episode_id) == "generated"
