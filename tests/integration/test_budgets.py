"""Every cap and every period budget holds against money spent, checked inside the claim.
Counted from the provider's side: the fake provider's own log (``job_created``
carries what it bills, ``cost_micros``) and the local HTTP server's bill."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.planning import RunLimits
from episodic.core.pricing import Reservation
from episodic.core.records import RefusalReason
from episodic.core.runs import Claim, Refusal
from episodic.core.states import RunState
from episodic.storage.budgets import Guard
from episodic.storage.claims import ClaimStore
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore
from tests.acceptance.conftest import EPISODIC
from tests.generation import new_episode, new_run, provider_log, write_playlist
from tests.http_server import TOKEN, PredictionsServer
from tests.integration import budget_workers as bw
from tests.integration import race_workers as w
from tests.integration.paid_episodes import ledger_micros, planned_episodes

pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert EPISODIC is not None
    return subprocess.run(
        [EPISODIC, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def _fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, price: str, delay_ms: int = 0) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        f'profiles:\n  paid:\n    kind: fake\n    price: {{per_image: "{price}"}}\n'
        f"    max_concurrency: 64\n    delay_ms: {delay_ms}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _bill() -> tuple[int, int]:
    """(jobs, micro-units) the fake billed, by its own log."""
    jobs = [e for e in provider_log() if e["event"] == "job_created"]
    return len(jobs), sum(int(e["cost_micros"]) for e in jobs)


def free_profile_billed_in_replies(
    server: PredictionsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profile ``paid``: a `free: true` http profile (estimate 0) on `server`, whose replies
    carry what it bills (`report_cost`)."""
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  paid:\n    kind: http\n"
        f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
        '    price: {per_image: "0"}\n    free: true\n'
        "    timeout_s: 2\n    poll_interval_s: 0.05\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)


def test_eight_generate_processes_never_pass_the_weekly_budget(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight `episodic generate` processes on eight episodes of one pipeline, released
    together, 24 images at 0.10 against a weekly budget of 1.00 (several trials, the budget
    raised by 1.00 each): the fake's bill never passes the budget, every process ends with a
    documented code (0 done, 7 stopped at the budget; 2 only for a plan refused up front as
    estimated above what remains), and the ledger equals the fake's bill to the micro-unit."""
    _fake(tmp_path, monkeypatch, "0.10", delay_ms=50)
    for trial in range(1, 4):
        budget = f"{trial}.00"
        assert _cli("pipelines", "set-budget", "weekly", budget, "--per", "week").returncode == 0
        episodes = planned_episodes(engine, tmp_path / f"t{trial}", 8, items=3)
        env = {"EPISODIC_HOME": os.environ["EPISODIC_HOME"]}
        results = w.run_processes(
            [(bw.cli_worker, (["generate", e, "--json"], env)) for e in episodes]
        )
        codes = sorted(code for _args, code, _out, _err in results)
        for _args, code, out, err in results:
            assert code in (0, 2, 7), (code, out, err)
            if code == 2:  # refused before anything was created: the plan's estimate
                assert "estimated" in err and "budget" in err, err
            if code == 7:
                assert "budget reached" in json.loads(out)["message"], out
        jobs, billed = _bill()
        assert billed <= trial * 1_000_000, (jobs, billed, codes)
        assert 7 in codes or 2 in codes, codes  # 24 images never fit: someone was stopped
        assert ledger_micros(engine) == billed  # the ledger is the provider's bill, exactly


def test_failed_billed_jobs_then_retries_never_pass_the_run_limit(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five items whose jobs fail billed (0.04 each), --max-cost 0.20 (then --max-images 5),
    then `retry` three times: the provider bills 5 jobs, 0.20, never more; each retry stops
    at the limit with exit 7 and says how to go on."""
    _fake(tmp_path, monkeypatch, "0.04")
    prompt = "cover [[FAIL_REMOTE]] {title} part {part}"
    runs: dict[str, str] = {}
    for limit in (["--max-cost", "0.20"], ["--max-images", "5"]):
        before = _bill()
        (episode,) = planned_episodes(
            engine, tmp_path / limit[0].strip("-"), 1, items=5, prompt=prompt
        )
        first = _cli("generate", episode, *limit, "--json")
        assert first.returncode == 4, first  # every item failed (billed)
        runs[limit[0]] = json.loads(first.stdout)["run_id"]
        for _ in range(3):
            again = _cli("retry", episode)
            assert again.returncode == 7, again
            assert "stopped buying: budget reached" in again.stderr + again.stdout
            assert "runs resume" in again.stderr + again.stdout
        jobs, billed = _bill()
        assert (jobs - before[0], billed - before[1]) == (5, 200_000)
    # going on past the cap: a bigger --max-cost on `runs resume` (validated: exit 2), the
    # run's whole spend counted: two more calls fit in 0.28, not more
    run_id = runs["--max-cost"]
    bad = _cli("runs", "resume", run_id, "--max-cost", "0.2.8")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad
    more = _cli("runs", "resume", run_id, "--max-cost", "0.28")
    assert more.returncode == 7, more
    after = _bill()
    assert (after[0] - jobs, after[1] - billed) == (2, 80_000), (after, jobs, billed)


def test_a_reply_cost_above_the_estimate_stops_buying_at_once(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `free: true` profile (estimate 0) whose HTTP provider bills 0.40 per image in its
    reply, --max-cost 0.80, eight items: the provider's bill never passes 0.80."""
    with PredictionsServer(price_micros=400_000, report_cost=True) as server:
        free_profile_billed_in_replies(server, tmp_path, monkeypatch)
        (episode,) = planned_episodes(engine, tmp_path, 1, items=8)
        done = _cli("generate", episode, "--max-cost", "0.80", "--concurrency", "4")
        assert done.returncode == 7, done
        assert server.bill_micros <= 800_000, server.bill_micros
        assert server.bill_micros == ledger_micros(engine) == 800_000


def test_set_budget_refuses_bad_input_and_a_budget_below_the_spend(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(tmp_path, monkeypatch, "0.10")
    for bad in (
        ["abc"],
        ["-1"],
        ["NaN"],
        ["1.0000001"],
        ["1e3"],
        ["5", "--per", "day"],
        ["5", "--currency", "usd"],
        [],
    ):
        refused = _cli("pipelines", "set-budget", "weekly", *bad)
        assert refused.returncode == 2, (bad, refused)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "Traceback" not in refused.stderr
    listed = json.loads(_cli("pipelines", "list", "--json").stdout)
    assert all(not row["budgets"] for row in listed), listed  # nothing written
    (episode,) = planned_episodes(engine, tmp_path, 1, items=3)
    assert _cli("generate", episode).returncode == 0  # 0.30 spent this week
    below = _cli("pipelines", "set-budget", "weekly", "0.25", "--per", "week")
    assert below.returncode == 2 and "0.30" in below.stderr, below
    ok = _cli("pipelines", "set-budget", "weekly", "20.00", "--per", "month", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["spent"] == "0.30", ok
    listed = json.loads(_cli("pipelines", "list", "--json").stdout)
    (weekly,) = [row for row in listed if row["pipeline"] == "weekly"]
    assert weekly["budgets"] == {
        "month": {
            "amount": "20.00",
            "amount_micros": 20_000_000,
            "currency": "USD",
            "shown": "20.00 USD",
        }
    }
    assert "20.00" in _cli("pipelines", "list").stdout
    assert _cli("pipelines", "set-budget", "weekly", "--per", "month", "--clear").returncode == 0
    assert json.loads(_cli("pipelines", "list", "--json").stdout)[0]["budgets"] == {}
    # a plan whose estimate alone passes what remains is refused up front, nothing created
    assert _cli("pipelines", "set-budget", "weekly", "0.50", "--per", "week").returncode == 0
    (second,) = planned_episodes(engine, tmp_path / "b", 1, items=3)
    planned = _cli("generate", second)
    assert planned.returncode == 2 and "estimated" in planned.stderr, planned
    with engine.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT count(*) FROM runs r JOIN episodes e ON e.id = r.episode_pk "
                "WHERE e.episode_id = :e"
            ),
            {"e": second},
        ).scalar_one()
    assert runs == 0


def test_a_re_buy_is_held_against_the_caps_and_the_budget(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LeaseStore.new_attempt` (a re-buy, --force-resubmit) checks the run's spend and the
    period budget in its transaction, as a claim does. As in the product, the item's open
    call is closed before a further one is made (an item never has two open)."""
    _fake(tmp_path, monkeypatch, "0.10")
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="paid"))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=30)
    with engine.connect() as conn:
        pks = [int(r[0]) for r in conn.execute(text("SELECT id FROM items ORDER BY id"))]
    reserve = Reservation(100_000, "USD")
    cap = Guard(run_id, "weekly", RunLimits(None, 150_000), reserve)
    roomy = Guard(run_id, "weekly", RunLimits(None, 10_000_000), reserve)
    claims, ledger = ClaimStore(engine), LedgerStore(engine)

    def claim(pk: int, guard: Guard) -> Claim | Refusal:
        return claims.claim(
            pk,
            run_id,
            "me",
            lease_s=30,
            max_attempts=5,
            profile="paid",
            reserve=reserve,
            guard=guard,
        )

    assert isinstance(claim(pks[2], roomy), Claim)  # 0.10 in flight for c, all along
    got = claim(pks[0], roomy)
    assert isinstance(got, Claim) and got.submission is not None
    assert ledger.refuse(got, got.submission.pk, "abandoned by operator (--force-resubmit)")
    again = LeaseStore(engine).new_attempt(got, "paid", forced=True, reserve=reserve, guard=cap)
    assert isinstance(again, Refusal) and again.reason == RefusalReason.BUDGET
    assert (
        again.detail is not None and "0.15" in again.detail and "0.10 USD in flight" in again.detail
    )
    second = claim(pks[1], cap)
    assert isinstance(second, Refusal) and second.reason == RefusalReason.BUDGET
    # the period budget: 0.25 a week, 0.10 in flight: one more fits, not two
    assert _cli("pipelines", "set-budget", "weekly", "0.25", "--per", "week").returncode == 0
    fresh = LeaseStore(engine).new_attempt(got, "paid", forced=True, reserve=reserve, guard=roomy)
    assert fresh is not None and not isinstance(fresh, Refusal)
    over = claim(pks[1], roomy)
    assert isinstance(over, Refusal) and "weekly budget 0.25 USD" in (over.detail or "")
    assert ledger.refuse(got, fresh.pk, "abandoned by operator (--force-resubmit)")
    euro = Guard(run_id, "weekly", RunLimits(), Reservation(100_000, "EUR"))
    mixed = LeaseStore(engine).new_attempt(got, "paid", forced=True, reserve=reserve, guard=euro)
    assert isinstance(mixed, Refusal) and "never summed" in (mixed.detail or "")
