"""Every fault mode of a local provider server, through the engine, on SQLite and Postgres.

Money is counted where it is spent: the server's own count of the jobs it made (`jobs_made`)
and its bill (`bill_micros`), compared with the ledger. For every mode: one job per item, and
the ledger's cost equals the server's bill.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from episodic.core.exit_codes import ExitCode
from episodic.pipeline.check import check_episodes
from episodic.providers.fake import render_png
from episodic.storage.models import CostEntryRow, ItemRow, SubmissionRow
from tests.generation import Episode, new_episode, write_playlist
from tests.http_server import TOKEN, PredictionsServer

AFTER_THE_JOB_WAS_MADE = [
    "[[CREATED_502]]",
    "[[CREATED_504]]",
    "[[CREATED_409]]",
    "[[CREATED_422_IDEMPOTENCY]]",
    "[[MALFORMED_CREATE]]",
    "[[ACCEPT_DROP]]",
    "[[SLOW_MS:1500]]",  # past the 1 s timeout: the reply never arrives in time
]
SLOW_TO_DELIVER = [
    "[[POLL_QUEUED:3]]",
    "[[POLL_401]]",
    "[[POLL_500:2]]",
    "[[POLL_BADJSON]]",
    "[[DOWNLOAD_404:2]]",
]


def _profile(tmp_path: Path, server: PredictionsServer, *, idempotent: bool, lookup: bool) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n"
        "  http-test:\n"
        "    kind: http\n"
        f"    base_url: {server.base_url}\n"
        "    credential_env: TEST_IMAGE_TOKEN\n"
        "    cost_per_image_minor: 5\n"
        "    max_concurrency: 4\n"
        "    timeout_s: 1\n"
        "    poll_interval_s: 0.05\n"
        f"    idempotent_create: {str(idempotent).lower()}\n"
        f"    lookup: {str(lookup).lower()}\n"
    )
    return path


@pytest.fixture
def make(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    servers: list[PredictionsServer] = []

    def build(
        *, honour: bool = True, idempotent: bool = False, lookup: bool = True, **options: object
    ) -> tuple[Episode, PredictionsServer]:
        server = PredictionsServer(honour_idempotency=honour, **options).__enter__()  # type: ignore[arg-type]
        servers.append(server)
        profiles = _profile(tmp_path, server, idempotent=idempotent, lookup=lookup)
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        return new_episode(engine), server

    yield build
    for server in servers:
        server.__exit__(None, None, None)


def _plan(episode: Episode, tmp_path: Path, titles: list[str]) -> None:
    episode.plan(write_playlist(tmp_path / "playlist", titles, profile="http-test"))


def _ledger_cost(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.coalesce(func.sum(CostEntryRow.amount_micros), 0))
            ).scalar_one()
        )


def _assert_once_and_billed(episode: Episode, server: PredictionsServer, items: int) -> None:
    assert len(server.jobs_made) == items, "an item never got its job"
    assert set(server.jobs_made.values()) == {1}, f"a second job was made: {server.jobs_made}"
    assert _ledger_cost(episode.engine) == server.bill_micros
    assert check_episodes(episode.engine, "weekly") == []


def _assert_own_images(episode: Episode, server: PredictionsServer) -> None:
    """Each item holds the image of its own job (never another item's)."""
    with episode.engine.connect() as conn:
        rows = conn.execute(select(ItemRow.prompt, ItemRow.seed, ItemRow.output_sha256)).all()
    for prompt, seed, sha in rows:
        assert hashlib.sha256(render_png(prompt, seed)).hexdigest() == sha


@pytest.mark.slow
@pytest.mark.parametrize("honour", [True, False], ids=["idempotent-create", "lookup-only"])
@pytest.mark.parametrize("marker", AFTER_THE_JOB_WAS_MADE)
def test_an_unknown_create_is_reconciled_never_bought_again(
    make: object, tmp_path: Path, marker: str, honour: bool
) -> None:
    # A provider that honours Idempotency-Key is declared so; one that does not is declared
    # lookup-only. The engine follows the declaration.
    episode, server = make(honour=honour, idempotent=honour, lookup=not honour)  # type: ignore[operator]
    _plan(episode, tmp_path, [f"lost {marker}", "fine", "also fine"])
    first = episode.generate()
    resumed = episode.resume(first.run_id) if first.exit_code != ExitCode.OK else first
    if honour and "SLOW" in marker:  # every resend is slow too and nothing can look it up:
        assert resumed.exit_code == ExitCode.PARTIAL  # it stays unknown, never bought again
        assert set(server.jobs_made.values()) == {1} and len(server.jobs_made) == 3
        findings = check_episodes(episode.engine, "weekly")
        assert [f.check for f in findings] == ["ledger"], findings  # the unpaid-for job shows
        return
    assert resumed.exit_code == ExitCode.OK, resumed.message
    _assert_once_and_billed(episode, server, 3)
    _assert_own_images(episode, server)
    assert episode.generate().counts.paid_submissions == 0  # and it never pays again


@pytest.mark.parametrize("marker", SLOW_TO_DELIVER)
def test_an_accepted_job_slow_to_deliver_is_collected_not_bought_again(
    make: object, tmp_path: Path, marker: str
) -> None:
    episode, server = make()  # type: ignore[operator]
    _plan(episode, tmp_path, [f"slow {marker}", "fine"])
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK, outcome.message
    _assert_once_and_billed(episode, server, 2)


@pytest.mark.slow
def test_an_accepted_job_not_delivered_in_time_is_collected_by_the_next_run(
    make: object, tmp_path: Path
) -> None:
    episode, server = make()  # type: ignore[operator]
    _plan(episode, tmp_path, ["late [[DOWNLOAD_404:1000]]", "fine"])
    first = episode.generate(collect_timeout_s=1)
    assert first.exit_code == ExitCode.PARTIAL
    with episode.engine.connect() as conn:
        assert set(conn.execute(select(SubmissionRow.state)).scalars()) == {
            "accepted",
            "succeeded",
        }
        error = conn.execute(select(ItemRow.error_text).where(ItemRow.video_id == "v01")).scalar()
    assert "not collected yet" in str(error)
    findings = check_episodes(episode.engine, "weekly")
    assert [f.check for f in findings] == ["ledger"] and "never collected" in findings[0].detail
    server.faults_off = True  # the CDN caught up
    again = episode.resume(first.run_id)
    assert again.exit_code == ExitCode.OK and again.counts.paid_submissions == 2  # no new one
    _assert_once_and_billed(episode, server, 2)


def test_a_list_that_ignores_its_filter_never_hands_us_another_items_job(
    make: object, tmp_path: Path
) -> None:
    episode, server = make(honour=False, lookup=True, list_ignores_filter=True)  # type: ignore[operator]
    _plan(episode, tmp_path, ["a", "b [[ACCEPT_DROP]]", "c", "d [[CREATED_502]]"])
    first = episode.generate(concurrency=1)
    if first.exit_code != ExitCode.OK:
        first = episode.resume(first.run_id)
    assert first.exit_code == ExitCode.OK
    _assert_once_and_billed(episode, server, 4)
    _assert_own_images(episode, server)


def test_without_lookup_or_idempotent_create_an_unknown_waits_for_an_operator(
    make: object, tmp_path: Path
) -> None:
    episode, server = make(honour=False, idempotent=False, lookup=False)  # type: ignore[operator]
    _plan(episode, tmp_path, ["lost [[CREATED_502]]"])
    first = episode.generate()
    again = episode.resume(first.run_id)
    assert first.exit_code == again.exit_code == ExitCode.RUN_FAILED
    assert sum(server.create_calls.values()) == 1  # never sent again on its own
    with episode.engine.connect() as conn:
        error = conn.execute(select(ItemRow.error_text)).scalar_one()
    assert "\n" not in error and "neither" in error
    findings = check_episodes(episode.engine, "weekly")
    assert any("acceptance unknown" in f.detail for f in findings)  # check is not clean


def test_a_remote_failure_is_billed_and_a_retry_is_a_new_job(make: object, tmp_path: Path) -> None:
    episode, server = make()  # type: ignore[operator]
    _plan(episode, tmp_path, ["doomed [[REMOTE_FAIL]]"])
    first = episode.generate()
    assert first.exit_code == ExitCode.RUN_FAILED
    assert _ledger_cost(episode.engine) == server.bill_micros == 50_000
    episode.resume(first.run_id)  # the provider said the job failed: a retry may buy again
    assert sum(server.jobs_made.values()) == 2
    assert _ledger_cost(episode.engine) == server.bill_micros


def test_credentials_go_to_the_provider_origin_only(make: object, tmp_path: Path) -> None:
    episode, server = make(output_host=True)  # type: ignore[operator]
    _plan(episode, tmp_path, ["a", "b [[DOWNLOAD_404]]"])
    assert episode.generate().exit_code == ExitCode.OK
    assert server.files is not None and server.files.requests
    assert all("authorization" not in r.headers for r in server.files.requests)
    api = [r for r in server.requests if not r.path.startswith("/v1/files/")]
    assert api and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in api)


def test_a_create_never_sent_is_a_plain_failure(
    make: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.errors import ProviderConfigError

    episode, server = make()  # type: ignore[operator]
    _plan(episode, tmp_path, ["a"])
    monkeypatch.setenv("TEST_IMAGE_TOKEN", "line\nbreak")
    with pytest.raises(ProviderConfigError):
        episode.generate()
    assert not server.requests


def test_a_5xx_with_no_job_is_settled_by_an_idempotent_resend_even_with_lookup(
    make: object, tmp_path: Path
) -> None:
    # HTTP 500 before the job was made: the lookup finds nothing, and a provider that honours
    # Idempotency-Key is sent the same create again, which makes the one job.
    episode, server = make(honour=True, idempotent=True, lookup=True)  # type: ignore[operator]
    _plan(episode, tmp_path, ["flaky [[HTTP_500]]", "fine"])
    assert episode.generate().exit_code == ExitCode.OK
    _assert_once_and_billed(episode, server, 2)


def test_a_cancel_during_the_backoff_between_refused_creates_stops_the_next_try(
    make: object, tmp_path: Path
) -> None:
    # The provider refuses the first create with 429 (nothing made, so a retry is allowed).
    # While the engine backs off, the run is cancelled from elsewhere: the next try is a
    # paid call and must check the claim first, so nothing is ever created.
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    cancelled: list[str] = []

    def cancel_on_first_refusal(prompt: str, calls: int) -> None:
        if "[[HTTP_429" in prompt and calls == 1:
            store = RunStore(episode.engine)
            (run,) = [r for r in store.list_runs("weekly") if r.state == "running"]
            store.transition_run(run.run_id, RunState.CANCELLED, "cancelled by operator")
            cancelled.append(run.run_id)

    episode, server = make(on_create=cancel_on_first_refusal)  # type: ignore[operator]
    _plan(episode, tmp_path, ["refused once [[HTTP_429:1]]"])
    outcome = episode.generate()
    assert cancelled and outcome.exit_code == ExitCode.INTERRUPTED, outcome.message
    assert sum(server.create_calls.values()) == 1  # the retry after the backoff never went
    assert not server.jobs_made and server.bill_micros == 0
    assert RunStore(episode.engine).run_state(cancelled[0]) == "cancelled"


def test_a_cancel_before_an_idempotent_resend_stops_it(make: object, tmp_path: Path) -> None:
    # A 500 before the job was made leaves acceptance unknown; the same create sent again
    # would make the one job, so it is a paid call and a cancel that came first stops it.
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    cancelled: list[str] = []

    def cancel_on_first_create(prompt: str, calls: int) -> None:
        if calls == 1:
            store = RunStore(episode.engine)
            (run,) = [r for r in store.list_runs("weekly") if r.state == "running"]
            store.transition_run(run.run_id, RunState.CANCELLED, "cancelled by operator")
            cancelled.append(run.run_id)

    episode, server = make(  # type: ignore[operator]
        honour=True, idempotent=True, lookup=True, on_create=cancel_on_first_create
    )
    _plan(episode, tmp_path, ["flaky [[HTTP_500:1]]"])
    episode.generate()
    assert cancelled
    assert sum(server.create_calls.values()) == 1 and not server.jobs_made
    assert server.bill_micros == 0 == _ledger_cost(episode.engine)
