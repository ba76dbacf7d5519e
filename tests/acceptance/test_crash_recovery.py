"""A real `episodic generate` killed mid-run (SIGTERM as systemd, `docker stop` or a CI
timeout send it; kill -9), then the one recovery command. Money is counted from the fake
provider's side: the jobs it holds (one file per job), one per item, whatever was killed
when."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.acceptance.conftest import EPISODIC
from tests.generation import (
    generate_in_background,
    jobs_per_key,
    made_jobs_per_key,
    provider_log,
    until_jobs,
    write_playlist,
)

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
ITEMS = 10
LEASE_S = "5"


@pytest.fixture(autouse=True)
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_LEASE_S", LEASE_S)
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "400")


@pytest.fixture
def episode(cli: Cli, database_url: str, tmp_path: Path) -> str:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", [f"t{n}" for n in range(ITEMS)])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    return "2026-W32-0"


def _start_and_kill(episode: str, sig: signal.Signals) -> subprocess.CompletedProcess[str]:
    process = generate_in_background(episode, "--json", "--concurrency", "2")
    until_jobs(process, 3)
    process.send_signal(sig)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _runs(cli: Cli, episode: str) -> list[dict[str, object]]:
    return list(json.loads(cli("runs", "list", "--episode", episode, "--json").stdout))


@pytest.mark.parametrize("recovery", ["retry", "runs resume"])
def test_sigterm_pauses_the_run_and_one_command_finishes_it(
    cli: Cli, episode: str, recovery: str
) -> None:
    killed = _start_and_kill(episode, signal.SIGTERM)
    assert killed.returncode == 130, killed.stderr
    assert json.loads(killed.stdout)["state"] == "paused"
    [run] = _runs(cli, episode)
    assert run["state"] == "paused"
    args = ["retry", episode] if recovery == "retry" else ["runs", "resume", str(run["run_id"])]
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "completed"
    _assert_finished_once(cli, episode)


@pytest.mark.parametrize("recovery", ["retry", "generate", "runs resume"])
def test_kill_9_leaves_a_running_run_that_one_command_finishes(
    cli: Cli, episode: str, recovery: str
) -> None:
    killed = _start_and_kill(episode, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    [run] = _runs(cli, episode)
    assert run["state"] == "running"  # nobody could record anything
    # Immediately, while the dead process's leases are still live: the command follows the
    # items it held and takes them over when the leases expire; it never says "completed"
    # while any item is unfinished.
    args = {
        "retry": ["retry", episode],
        "generate": ["generate", episode],
        "runs resume": ["runs", "resume", str(run["run_id"])],
    }[recovery]
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["state"] == "completed"
    assert answer["failed"] == 0 and answer["pending"] == 0 and answer["running"] == 0
    _assert_finished_once(cli, episode)


def until_outstanding(process: subprocess.Popen[str], jobs: int, timeout_s: float = 60) -> None:
    """Wait until `process` holds `jobs` accepted jobs it has not collected (the fake's own
    log); fails if it ends first or makes no progress."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = provider_log()
        made = {e["remote_ref"] for e in log if e["event"] == "job_created"}
        taken = {e["remote_ref"] for e in log if e["event"] == "collect"}
        if len(made - taken) >= jobs:
            return
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "generate made no progress"
        time.sleep(0.05)


SLOW_PROFILE = (
    "profiles:\n  slow:\n    kind: fake\n    cost_per_image_minor: 4\n"
    "    max_concurrency: 2\n    delay_ms: 1500\n    max_job_s: 60\n"
)


@pytest.mark.parametrize("recovery", ["retry", "runs resume"])
def test_recovery_after_kill_9_collects_the_dead_processs_jobs_before_any_new_create(
    cli: Cli, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recovery: str
) -> None:
    """A provider limit of 2, both slots taken by the jobs a generate had accepted when it
    was killed (-9). Those jobs belong to the run and hold its slots until collected (or
    `max_job_s` has passed). The recovery, started while the dead process's leases are
    still live (15 s here), does not wait `max_job_s` (60 s) asking for a slot for its next
    new item and collect the dead jobs last: it collects them as soon as the leases run
    out, before any new create: the order is asserted at the provider, never a duration; one
    job per item, counted in the provider's job store."""
    from episodic.storage.engine import make_engine
    from episodic.storage.runs import RunStore

    profiles = tmp_path / "providers.yaml"
    profiles.write_text(SLOW_PROFILE)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.setenv("EPISODIC_LEASE_S", "15")
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", [f"t{n}" for n in range(6)], profile="slow")
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    process = generate_in_background("2026-W32-0", "--json", "--concurrency", "2")
    until_outstanding(process, 2)  # the profile's whole limit is at the provider
    process.kill()
    process.communicate(timeout=60)
    # The jobs the killed process left accepted: made, not collected by it (a profile never
    # billed before sends its first call alone, so that one may be collected already).
    made_by_it = {e["remote_ref"] for e in provider_log() if e["event"] == "job_created"}
    collected = {
        e["remote_ref"]
        for e in provider_log()
        if e["event"] == "collect" and e["pid"] == process.pid
    }
    dead = made_by_it - collected
    assert dead, "the killed process left no accepted job behind"
    dead_refs = {e["client_reference"] for e in provider_log() if e["event"] == "submit"}
    engine = make_engine(database_url)
    [run] = RunStore(engine).list_runs("weekly")  # read directly: the leases are still live
    engine.dispose()
    args = ["retry", "2026-W32-0"] if recovery == "retry" else ["runs", "resume", run.run_id]
    assert EPISODIC is not None
    done = subprocess.run(  # the CLI fixture's 120 s would cut the old wait short
        [EPISODIC, *args, "--json"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "completed"
    made = made_jobs_per_key()
    assert len(made) == 6 and set(made.values()) == {1}, made  # at the provider's side
    # The fake runs in the process that calls it: the killed one's pid marks its events.
    recovering = [e for e in provider_log() if e["pid"] != process.pid]
    assert dead <= {e["remote_ref"] for e in recovering if e["event"] == "collect"}
    order = [
        "collect-dead" if e["event"] == "collect" else "create-new"
        for e in recovering
        if (e["event"] == "collect" and e["remote_ref"] in dead)
        or (e["event"] == "submit" and e["client_reference"] not in dead_refs)
    ]
    assert order[0] == "collect-dead", order  # before it bought anything new
    assert order.count("create-new") == 6 - len(made_by_it), order


def test_after_kill_9_check_reports_the_dead_run_and_the_sweep_reaps_it(
    cli: Cli, episode: str
) -> None:
    killed = _start_and_kill(episode, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    [run] = _runs(cli, episode)
    time.sleep(float(LEASE_S) + 0.5)  # the leases expire: nobody renews them
    checked = cli("check", "--all")
    assert checked.returncode == 8 and "lease expired" in checked.stdout, checked.stdout
    swept = cli("sweep", "--json")
    assert swept.returncode == 0, swept.stderr
    buckets = json.loads(swept.stdout)["buckets"]
    assert buckets["expired_runs"]["ids"] == [run["run_id"]]
    assert buckets["expired_items"]["count"] >= 1
    again = json.loads(cli("sweep", "--json").stdout)["buckets"]
    assert all(b["count"] == 0 for b in again.values())  # a second sweep finds nothing
    [reaped] = _runs(cli, episode)
    assert reaped["state"] == "failed"
    done = cli("retry", episode, "--json")
    assert done.returncode == 0, done.stderr
    _assert_finished_once(cli, episode)


def _assert_finished_once(cli: Cli, episode: str) -> None:
    jobs = made_jobs_per_key()  # the jobs the provider holds (see `made_jobs_per_key`)
    assert len(jobs) == ITEMS and set(jobs.values()) == {1}, jobs
    assert set(jobs_per_key()) <= set(jobs)  # every job its log shows is one of them
    shown = json.loads(cli("episodes", "show", episode, "--json").stdout)
    assert shown["state"] == "generated"
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout
    assert not [r for r in _runs(cli, episode) if r["state"] in ("running", "pending")]


def test_refused_generates_leave_no_rows(cli: Cli, database_url: str, tmp_path: Path) -> None:
    """No ghost rows from the command line: a credential that is not set, five times."""
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  paid:\n    kind: http\n    base_url: http://127.0.0.1:9/v1\n"
        "    credential_env: PAID_TOKEN\n    cost_per_image_minor: 4\n"
    )
    env = {"EPISODIC_PROVIDERS_FILE": str(profiles)}
    assert cli("allocate", "--key", "k", "--week", "2026-W32", env=env).returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b"], profile="paid")
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist), env=env).returncode == 0
    for _ in range(5):
        refused = cli("generate", "2026-W32-0", env=env)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.strip().splitlines() == [
            "error: credential for profile 'paid': $PAID_TOKEN is not set"
        ]
    assert _runs(cli, "2026-W32-0") == []
    assert cli("check", "--all", env=env).returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupting_one_of_two_processes_on_a_run_lets_the_other_finish_it(
    cli: Cli, episode: str, sig: signal.Signals
) -> None:
    """Two `generate` processes on one episode share one run. Ctrl-C or SIGTERM of one of
    them pauses the run; the other, never signalled, does not stop too (exit 130,
    "interrupted and paused", items left for a recovery command): it reopens the run and
    finishes it, exit 0, every item paid once."""
    assert EPISODIC is not None
    command = [EPISODIC, "generate", episode, "--json", "--concurrency", "2"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while sum(1 for e in provider_log() if e["event"] == "job_created") < 3:
        assert first.poll() is None and second.poll() is None, "a process ended early"
        assert time.monotonic() < deadline, "generate made no progress"
        time.sleep(0.05)
    first.send_signal(sig)
    first.communicate(timeout=60)
    assert first.returncode == 130
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, (out, err)
    assert json.loads(out)["state"] == "completed"
    _assert_finished_once(cli, episode)
