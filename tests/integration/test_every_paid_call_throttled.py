"""Every paid call goes through the profile's one throttle: the first create, the create of
an unknown outcome sent again under its ``Idempotency-Key``, a re-buy and an operator's
``--force-resubmit``. Against the predictions server (tests/http_server.py), counted at its
side (the jobs it made, its bill, the moment and answer of each create), on SQLite and
PostgreSQL.

- A 503 with ``Retry-After`` made nothing, for the http adapter as for Replicate's and fal's:
  the create is sent again after the wait, one job (not an unknown outcome an operator must
  hunt for). A gateway's 503 after the job was made is answered, on the resend under the same
  key, with that job: still one.
- A create sent again to settle an unknown outcome honours the provider's ``Retry-After``
  (not a few fixed short delays), records it for the profile, and waits for a moment another
  worker recorded.
- A forced resubmit and a `media restore --buy-again` send nothing while the profile is
  held past the bound: the run pauses; once the moment passed they buy once.
"""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.exit_codes import ExitCode
from episodic.core.states import RunState
from episodic.storage.base import utcnow
from episodic.storage.throttles import ThrottleStore
from tests.generation import Episode, image_keys, new_episode, store_file, write_playlist
from tests.http_server import TOKEN, PredictionsServer

PROFILE = "paid"


def _profile(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: PredictionsServer,
    *,
    idempotent: bool = False,
    lookup: bool = True,
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"profiles:\n  {PROFILE}:\n    kind: http\n"
        f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
        "    cost_per_image_minor: 5\n    timeout_s: 2\n    poll_interval_s: 0.05\n"
        f"    idempotent_create: {str(idempotent).lower()}\n    lookup: {str(lookup).lower()}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)


def _planned(engine: Engine, tmp_path: Path, title: str) -> Episode:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", [title], profile=PROFILE))
    return episode


def _statuses(server: PredictionsServer) -> list[int]:
    return [status for _, status in server.create_log]


def _recorded_hold(engine: Engine) -> str | None:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT detail FROM provider_throttles WHERE profile = :p"), {"p": PROFILE}
        ).scalar_one_or_none()
    return None if found is None else str(found)


def _lift_hold(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE provider_throttles SET not_before = :t"),
            {"t": utcnow() - timedelta(seconds=1)},
        )


def _unknown(engine: Engine, tmp_path: Path, server: PredictionsServer) -> tuple[Episode, str]:
    """A run whose one create made a job and was answered 502 by a gateway (the profile
    has neither lookup nor idempotent create): its item is left unknown. (episode, run id)"""
    lost = [(502, {"detail": "bad gateway"})]  # the first create's reply only
    server.reply = lambda kind, _path: lost.pop() if kind == "create" and lost else None
    episode = _planned(engine, tmp_path, "fox")
    first = episode.generate()
    assert first.exit_code != ExitCode.OK and first.run_id is not None, first.message
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM submissions")).scalar_one() == "unknown"
    return episode, first.run_id


def _unknown_then_held(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: PredictionsServer,
    hold_s: float,
    *,
    idempotent: bool = False,
) -> tuple[Episode, str, float]:
    """`_unknown`, then the profile (`idempotent` now) held `hold_s` seconds as another
    worker records a throttle it heard: (episode, run id, the hold's end in monotonic time)."""
    _profile(tmp_path, monkeypatch, server, lookup=False)
    episode, run_id = _unknown(engine, tmp_path, server)
    _profile(tmp_path, monkeypatch, server, idempotent=idempotent, lookup=False)
    ThrottleStore(engine).hold(PROFILE, utcnow() + timedelta(seconds=hold_s), "Request throttled")
    return episode, run_id, time.monotonic() + hold_s


# ------------------------------------------------------------------ 503 with Retry-After
def test_a_503_with_retry_after_from_the_http_protocol_is_waited_out_and_bought_once(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer() as server:
        server.throttled_calls, server.throttle_status = {1}, 503
        _profile(tmp_path, monkeypatch, server)
        outcome = _planned(engine, tmp_path, "fox").generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert _statuses(server) == [503, 201]
        (first, _), (made, _) = server.create_log
        assert made - first >= 0.9, server.create_log  # not before its Retry-After: 1
        assert sum(server.jobs_made.values()) == 1 and server.bill_micros == 50_000
        assert _recorded_hold(engine) is not None  # shared with every worker of the profile


def test_a_gateways_503_after_the_job_was_made_gets_that_job_under_the_same_key(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule's one risk, and what answers it: the create sent again after the wait
    carries the same Idempotency-Key, and a server that honours it answers the job it made."""
    with PredictionsServer() as server:
        _profile(tmp_path, monkeypatch, server, idempotent=True)
        outcome = _planned(engine, tmp_path, "fox [[CREATED_503]]").generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert _statuses(server) == [503, 201]
        assert sum(server.jobs_made.values()) == 1 and server.bill_micros == 50_000


# ------------------------------------------------------------------ an unknown, sent again
def test_an_idempotent_resend_of_an_unknown_outcome_waits_out_the_providers_retry_after(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create made the job and its reply was lost (502); each create sent again under
    the same key is answered 429 with Retry-After: 1, four times: the engine waits each out
    (four quick tries gave the item up as unknown before) and gets the one job."""
    with PredictionsServer() as server:
        server.throttled_calls = {2, 3, 4, 5}
        _profile(tmp_path, monkeypatch, server, idempotent=True, lookup=False)
        outcome = _planned(engine, tmp_path, "fox [[CREATED_502]]").generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert _statuses(server) == [502, 429, 429, 429, 429, 201]
        times = [at for at, _ in server.create_log]
        waits = [later - sooner for sooner, later in pairwise(times[1:])]  # after each 429
        assert min(waits) >= 0.9, server.create_log  # never sooner than it asked
        assert sum(server.jobs_made.values()) == 1 and server.bill_micros == 50_000
        assert _recorded_hold(engine) is not None


def test_an_idempotent_resend_waits_for_a_throttle_another_worker_recorded(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer() as server:
        args = (engine, tmp_path, monkeypatch, server, 2.0)
        episode, run_id, held_until = _unknown_then_held(*args, idempotent=True)
        done = episode.resume(run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert _statuses(server) == [502, 201]
        assert server.create_log[-1][0] >= held_until - 0.1, (server.create_log, held_until)
        assert sum(server.jobs_made.values()) == 1


# ------------------------------------------------------------------ forced, and re-bought
def test_a_forced_resubmit_sends_nothing_while_the_profile_is_held_past_the_bound(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer() as server:
        episode, run_id, _ = _unknown_then_held(engine, tmp_path, monkeypatch, server, 3600)
        forced = episode.resume(run_id, force_resubmit=True)
        assert forced.state == RunState.PAUSED, forced.message
        assert forced.exit_code == ExitCode.INTERRUPTED, forced.message
        assert "Request throttled" in forced.message, forced.message
        assert _statuses(server) == [502] and sum(server.jobs_made.values()) == 1
        _lift_hold(engine)
        done = episode.resume(run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert _statuses(server) == [502, 201] and sum(server.jobs_made.values()) == 2


def test_a_forced_resubmit_waits_for_a_short_throttle_then_buys_once(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer() as server:
        args = (engine, tmp_path, monkeypatch, server, 2.0)
        episode, run_id, held_until = _unknown_then_held(*args)
        forced = episode.resume(run_id, force_resubmit=True)
        assert forced.exit_code == ExitCode.OK, forced.message
        assert _statuses(server) == [502, 201] and sum(server.jobs_made.values()) == 2
        assert server.create_log[-1][0] >= held_until - 0.1, (server.create_log, held_until)


def test_a_buy_again_sends_nothing_while_the_profile_is_held_past_the_bound(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-buy is a claim of a new paid call: the recorded throttle holds it (the run
    pauses, nothing sent); once the moment passed it buys once."""
    from episodic.cli.app import run

    with PredictionsServer() as server:
        _profile(tmp_path, monkeypatch, server)
        episode = _planned(engine, tmp_path, "fox")
        assert episode.generate().counts.completed == 1
        for key, *_ in image_keys(engine):
            store_file(key).unlink()
        server.expired.update(server.jobs)  # its output is no longer served
        ThrottleStore(engine).hold(PROFILE, utcnow() + timedelta(hours=1), "Request throttled")
        restore = ["media", "restore", episode.episode_id, "--pipeline", "weekly", "--buy-again"]
        restore += ["--yes", "--collect-timeout", "1"]
        assert run(restore) == ExitCode.INTERRUPTED  # paused at the throttle, nothing sent
        assert _statuses(server) == [201] and sum(server.jobs_made.values()) == 1
        _lift_hold(engine)
        assert run(restore) == ExitCode.OK
        assert _statuses(server) == [201, 201] and sum(server.jobs_made.values()) == 2
