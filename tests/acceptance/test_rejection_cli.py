"""A rejection stands until the plan changes or a recorded `reopen`.

`episodic generate E` with nothing to do leaves a rejected episode rejected: back at
`generated`, `approve` would ship the rejected images without any re-plan.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import made_jobs_per_key, write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e

EPISODE = "2026-W32-0"


def state(cli: Cli) -> str:
    shown = cli("episodes", "show", EPISODE, "--json")
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["state"])


def rejected_episode(cli: Cli, playlist: Path) -> None:
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", EPISODE, "--playlist", str(playlist)],
        ["generate", EPISODE],
        ["approve", EPISODE, "--reject", "--by", "bob", "--reason", "too dark"],
    ):
        result = cli(*step)
        assert result.returncode == 0, (step, result.stderr)
    assert state(cli) == "rejected"


def test_generate_retry_and_an_unchanged_plan_leave_a_rejection_standing(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    rejected_episode(cli, playlist)

    generated = cli("generate", EPISODE)
    assert generated.returncode == 0, generated.stderr
    (line,) = [text for text in generated.stdout.splitlines() if "stays rejected" in text]
    assert "stays rejected" in line and "bob" in line and "too dark" in line, line
    assert "episodic reopen" in line and "episodic plan" in line, line
    assert state(cli) == "rejected"

    as_json = cli("generate", EPISODE, "--json")
    assert as_json.returncode == 0 and "stays rejected" in json.loads(as_json.stdout)["message"]
    assert state(cli) == "rejected"

    retried = cli("retry", EPISODE)
    assert retried.returncode == 0, retried.stderr
    assert "stays rejected" in retried.stdout
    assert state(cli) == "rejected"

    unchanged = cli("plan", EPISODE, "--playlist", str(playlist))
    assert unchanged.returncode == 0 and "unchanged" in unchanged.stdout
    assert state(cli) == "rejected"

    approving = cli("approve", EPISODE, "--by", "ann")
    assert approving.returncode == 2
    assert "rejected by bob" in approving.stderr and "Traceback" not in approving.stderr
    assert state(cli) == "rejected"
    assert cli("assemble", EPISODE).returncode == 2
    assert sum(made_jobs_per_key().values()) == 2  # nothing was bought again


def test_a_changed_plan_brings_a_rejected_episode_back_for_review(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    rejected_episode(cli, write_playlist(tmp_path / "pl", ["a", "b"]))
    changed = write_playlist(tmp_path / "pl2", ["a", "brighter b"])
    assert cli("plan", EPISODE, "--playlist", str(changed)).returncode == 0
    assert state(cli) == "allocated"
    assert cli("generate", EPISODE).returncode == 0
    assert state(cli) == "generated"
    assert cli("approve", EPISODE, "--by", "ann").returncode == 0
    assert state(cli) == "approved"
    assert sum(made_jobs_per_key().values()) == 3  # only the changed image was bought


def test_reopen_of_a_rejected_episode_is_recorded_and_sends_it_back_for_review(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    rejected_episode(cli, write_playlist(tmp_path / "pl", ["a", "b"]))
    refused = cli("reopen", EPISODE, "--by", "carl", "--reason", " ")
    assert refused.returncode == 2 and state(cli) == "rejected"
    reopened = cli("reopen", EPISODE, "--by", "carl", "--reason", "a second look", "--json")
    assert reopened.returncode == 0, reopened.stderr
    assert json.loads(reopened.stdout)["from"] == "rejected"
    assert state(cli) == "allocated"
    history = json.loads(cli("episodes", "show", EPISODE, "--json").stdout)
    assert "carl" in json.dumps(history) and "a second look" in json.dumps(history)
    assert cli("generate", EPISODE).returncode == 0  # nothing to pay: the images exist
    assert state(cli) == "generated"
    assert cli("approve", EPISODE, "--by", "ann").returncode == 0
    assert cli("assemble", EPISODE).returncode == 0
    assert sum(made_jobs_per_key().values()) == 2
