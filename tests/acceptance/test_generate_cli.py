"""`episodic plan|generate|runs|retry` as a user runs them, including Ctrl-C mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.acceptance.conftest import EPISODIC
from tests.generation import submissions_per_item, write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def planned(cli: Cli, database_url: str, tmp_path: Path) -> Callable[[list[str]], str]:
    def make(titles: list[str]) -> str:
        assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
        playlist = write_playlist(tmp_path / "pl", titles)
        result = cli("plan", "2026-W32-0", "--playlist", str(playlist))
        assert result.returncode == 0, result.stderr
        return "2026-W32-0"

    return make


def test_generate_json_then_nothing_left_to_pay(
    cli: Cli, planned: Callable[[list[str]], str]
) -> None:
    episode = planned(["a", "b", "c"])
    shown = cli("generate", episode, "--plan", "--json")
    assert json.loads(shown.stdout)["new_calls"] == 3 and submissions_per_item() == {}
    first = cli("generate", episode, "--json")
    assert first.returncode == 0, first.stderr
    payload = json.loads(first.stdout)
    assert {
        k: payload[k]
        for k in ("state", "completed", "skipped", "failed", "paid_submissions", "cost_micros")
    } == {
        "state": "completed",
        "completed": 3,
        "skipped": 0,
        "failed": 0,
        "paid_submissions": 3,
        "cost_micros": 120_000,
    }
    again = json.loads(cli("generate", episode, "--json").stdout)
    assert again["skipped"] == 3 and again["paid_submissions"] == 0
    assert again["run_id"] is None and again["deduplicated"] is False  # nothing to do: no run
    runs = json.loads(cli("runs", "list", "--episode", episode, "--json").stdout)
    assert [r["state"] for r in runs] == ["completed"]
    shown_run = json.loads(cli("runs", "show", payload["run_id"], "--json").stdout)
    assert len(shown_run["items"]) == 3


@SQLITE_ONLY
def test_exit_codes(cli: Cli, planned: Callable[[list[str]], str]) -> None:
    episode = planned(["ok", "bad [[FAIL_PERMANENT]]"])
    assert cli("generate", "2026-W32-3").returncode == 5
    assert cli("generate", "2026-W99-0").returncode == 2
    for bad in (
        ["--only", "0"],
        ["--only", "3"],
        ["--only", "x"],
        ["--max-cost", "-1"],
        ["--max-cost", "1.0000001"],  # a seventh decimal
        ["--concurrency", "0"],
    ):
        result = cli("generate", episode, *bad)
        assert result.returncode == 2, (bad, result.stderr)
        assert "Traceback" not in result.stderr
    budget = cli("generate", episode, "--max-images", "1")
    assert budget.returncode == 2 and "nothing was created" in budget.stderr
    assert json.loads(cli("runs", "list", "--json").stdout) == []
    partial = cli("generate", episode)
    assert partial.returncode == 6
    run_id = json.loads(cli("runs", "list", "--json").stdout)[0]["run_id"]
    assert f"episodic runs resume {run_id}" in partial.stdout
    missing = cli("runs", "resume", "0d45478b-098c-4a4a-9a52-0d9ecb6a88ed")
    assert missing.returncode == 5 and "not found" in missing.stderr
    for malformed in ("no-such-run", "x" * 5000, "bad\nid"):
        for command in (["runs", "resume"], ["runs", "show"], ["runs", "cancel"]):
            result = cli(*command, malformed)
            assert result.returncode == 2 and "invalid run id" in result.stderr, command
            assert len(result.stderr.strip().splitlines()) == 1 and len(result.stderr) < 300
    retried = cli("retry", episode, "--json")  # the failed item gets its second attempt
    assert retried.returncode == 6
    refused = cli("runs", "cancel", run_id)  # failed -> cancelled is not a transition
    assert refused.returncode == 2 and "is failed: it cannot become cancelled" in refused.stderr


def test_resume_of_another_episodes_run_is_refused_and_pays_nothing(
    cli: Cli, planned: Callable[[list[str]], str]
) -> None:
    episode = planned(["a", "b [[FAIL_PERMANENT]]"])  # 2026-W32-0, its run fails one item
    assert cli("allocate", "--key", "other", "--week", "2026-W32").returncode == 0  # -1
    assert cli("generate", episode).returncode == 6
    run_id = json.loads(cli("runs", "list", "--json").stdout)[0]["run_id"]
    before = submissions_per_item()
    wrong = cli("generate", "2026-W32-1", "--resume", run_id)
    assert wrong.returncode == 2, wrong.stderr
    assert f"belongs to episode {episode}" in wrong.stderr and "Traceback" not in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    assert cli("generate", "2026-W32-X", "--resume", run_id).returncode == 2
    assert submissions_per_item() == before  # nothing paid
    assert cli("generate", episode, "--resume", run_id).returncode == 6  # its own episode


@SQLITE_ONLY
def test_collect_timeout_leaves_a_slow_job_to_the_next_run_at_no_cost(
    cli: Cli, planned: Callable[[list[str]], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    episode = planned(["slow"])
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "3000")  # the job is ready 3 s after submit
    started = time.monotonic()
    first = cli("generate", episode, "--collect-timeout", "1", "--json")
    assert first.returncode == 4, first.stderr  # with the default 600 s it would complete
    run_id = json.loads(first.stdout)["run_id"]
    (item,) = json.loads(cli("runs", "show", run_id, "--json").stdout)["items"]
    assert "not collected yet" in item["error_text"]
    assert cli("generate", episode, "--collect-timeout", "0").returncode == 2
    time.sleep(max(0.0, started + 3.2 - time.monotonic()))  # the provider finished the job
    again = cli("runs", "resume", run_id, "--json")
    assert again.returncode == 0, again.stderr
    assert submissions_per_item() == {"v01.p1": 1}  # collected, not bought again


@SQLITE_ONLY
def test_all_failed_exits_4(cli: Cli, planned: Callable[[list[str]], str]) -> None:
    episode = planned(["bad [[FAIL_PERMANENT]]"])
    assert cli("generate", episode).returncode == 4


def test_ctrl_c_pauses_the_run_and_resume_pays_each_item_once(
    cli: Cli, planned: Callable[[list[str]], str], fake_log: Path
) -> None:
    episode = planned([f"video {n}" for n in range(1, 9)])
    env = {**os.environ, "EPISODIC_FAKE_DELAY_MS": "1500"}
    assert EPISODIC is not None
    process = subprocess.Popen(
        [EPISODIC, "generate", episode, "--concurrency", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(submissions_per_item().values()) < 3:
        time.sleep(0.05)
    assert sum(submissions_per_item().values()) >= 3, "the run never got going"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (out, err)
    (run,) = json.loads(cli("runs", "list", "--json").stdout)
    assert run["state"] == "paused"
    items = json.loads(cli("runs", "show", run["run_id"], "--json").stdout)["items"]
    interrupted = [i for i in items if i["error_text"] == "interrupted"]
    assert interrupted and all(i["state"] == "failed" for i in interrupted)
    assert any(i["state"] == "pending" for i in items)  # never started: untouched
    before = submissions_per_item()

    resumed = cli("runs", "resume", run["run_id"], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "completed"
    after = submissions_per_item()
    assert set(after) == {f"v{n:02d}.p1" for n in range(1, 9)}
    assert set(after.values()) == {1}, f"an item was paid twice: {after}"
    assert all(after[key] == count for key, count in before.items())


def test_two_generate_commands_at_once_pay_each_item_once_and_both_succeed(
    cli: Cli, planned: Callable[[list[str]], str]
) -> None:
    """A person clicking twice: two `episodic generate E` processes started together."""
    from tests.generation import jobs_per_key

    episode = planned([f"t{n} [[DELAY_MS:150]]" for n in range(8)])
    commands = [
        subprocess.Popen(
            [EPISODIC, "generate", episode, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for _ in range(2)
    ]
    outputs = [command.communicate(timeout=240) for command in commands]
    for command, (out, err) in zip(commands, outputs, strict=True):
        assert command.returncode == 0, err
        assert json.loads(out)["state"] == "completed"
    answers = [json.loads(out) for out, _ in outputs]
    runs = {a["run_id"] for a in answers} - {None}  # None: the other had already finished
    assert len(runs) == 1, answers  # the second click joined the first one's run
    if None not in {a["run_id"] for a in answers}:
        assert sorted(a["deduplicated"] for a in answers) == [False, True]
    listed = json.loads(cli("runs", "list", "--episode", episode, "--json").stdout)
    assert [r["run_id"] for r in listed] == list(runs)
    assert len(jobs_per_key()) == 8 and set(jobs_per_key().values()) == {1}
    assert cli("check", "--all").returncode == 0


def test_an_idempotency_key_sent_again_with_other_parameters_is_refused(
    cli: Cli, planned: Callable[[list[str]], str]
) -> None:
    episode = planned(["a [[DELAY_MS:50]]", "b"])
    first = cli("generate", episode, "--idempotency-key", "cron-2026-08-03", "--json")
    assert first.returncode == 0, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    refused = cli("generate", episode, "--idempotency-key", "cron-2026-08-03", "--max-retries", "5")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: idempotency key 'cron-2026-08-03' was used for run {run_id} with different "
        "parameters; use a new key for a different request"
    ]
    for bad in ("has space", "x" * 256, "clé"):
        for plan_only in ([], ["--plan"]):
            answer = cli("generate", episode, "--idempotency-key", bad, *plan_only)
            assert answer.returncode == 2 and answer.stderr.startswith("error: invalid idempot")
            assert answer.stdout == ""
    assert len(json.loads(cli("runs", "list", "--json").stdout)) == 1
