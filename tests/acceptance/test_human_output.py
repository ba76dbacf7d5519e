"""Every command's human output, the path a person reads: a path that only `--json` tests
would leave open to a crash such as `KeyError: 'name'`.

One story on a real database, each command as a person types it, no `--json`: each ends
with its documented exit code, prints something, and never an "unexpected" error or a
traceback. (`prefect setup`, `serve`, `dispatch` and `demo` need a Prefect server: see
tests/e2e/test_prefect_setup.py and the flow tests.)
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import write_playlist

pytestmark = pytest.mark.slow

Cli = Callable[..., subprocess.CompletedProcess[str]]
PROJECT = Path(__file__).resolve().parents[2]


def human(cli: Cli, *args: str, code: int = 0) -> str:
    result = cli(*args)
    shown = f"episodic {' '.join(args)}: {result.stdout}{result.stderr}"
    assert result.returncode == code, shown
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr, shown
    assert (result.stdout + result.stderr).strip(), shown
    return result.stdout


def test_every_command_prints_its_human_output(cli: Cli, database_url: str, tmp_path: Path) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    assert human(cli, "allocate", "--key", "k", "--week", "2026-W32") == "2026-W32-0 (new)\n"
    human(
        cli,
        "allocate",
        "--key",
        "slot:weekly:2026-08-06T07:00:00Z",
        "--at",
        "2026-08-06T09:00:00+02:00",
    )
    human(cli, "plan", "2026-W32-0", "--playlist", str(playlist))
    human(cli, "generate", "2026-W32-0", "--plan")
    human(cli, "generate", "2026-W32-0")
    human(cli, "retry", "2026-W32-0")
    human(cli, "episodes", "list")
    human(cli, "episodes", "list", "--week", "2026-W32")
    human(cli, "episodes", "show", "2026-W32-0")
    human(cli, "runs", "list")
    run_id = json.loads(cli("runs", "list", "--json").stdout)[0]["run_id"]
    human(cli, "runs", "show", run_id)
    human(cli, "runs", "resume", run_id)  # a completed run: nothing to resume
    human(cli, "runs", "cancel", run_id, code=2)
    human(cli, "approve", "2026-W32-0", "--by", "ann", "--note", "fine")
    human(cli, "approve", "2026-W32-0", "--by", "ann")  # already approved
    human(cli, "assemble", "2026-W32-0")
    human(cli, "assemble", "2026-W32-0")  # unchanged
    assert human(cli, "check", "2026-W32-0") == "clean\n"
    human(cli, "check", "--all")
    human(cli, "reopen", "2026-W32-0", "--by", "ann", "--reason", "new cover")
    human(cli, "pipelines", "list")
    human(cli, "pipelines", "set-timezone", "weekly", "UTC")
    human(cli, "providers", "list")
    human(cli, "providers", "check", "fake")
    human(cli, "sweep", "--dry-run", "--no-prefect")
    human(cli, "sweep", "--no-prefect")
    human(cli, "db", "current")
    human(cli, "db", "upgrade")
    human(cli, "migrate-legacy", str(PROJECT / "examples" / "legacy"))
