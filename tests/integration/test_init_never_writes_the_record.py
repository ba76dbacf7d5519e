"""`episodic init` writes the providers file where the settings read it
(``EPISODIC_PROVIDERS_FILE``): a path the user names, so like every user-named output it never
writes over the record (docs/cli.md: the SQLite ledger and its ``-wal``, ``-shm`` and
``-journal`` files, anything inside a local media store): one line, exit 2, nothing written.
A YAML file written as the ledger's ``-journal`` is taken by SQLite for a hot journal: read-only
commands (`check`) fail on it until a writer deletes it, with the providers file in it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from tests.acceptance.conftest import EPISODIC

pytestmark = pytest.mark.slow


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert EPISODIC is not None
    return subprocess.run([EPISODIC, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "target", ["home/episodic.db-journal", "home/episodic.db-wal", "store/sha256/aa/new.yaml"]
)
def test_init_refuses_a_providers_file_that_is_part_of_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    monkeypatch.delenv("EPISODIC_DATABASE_URL", raising=False)
    env = dict(
        os.environ,
        EPISODIC_HOME=str(tmp_path / "home"),
        EPISODIC_MEDIA_URL=str(tmp_path / "store"),
        EPISODIC_PROVIDERS_FILE=str(tmp_path / "elsewhere.yaml"),
    )
    (tmp_path / "store" / "sha256" / "aa").mkdir(parents=True)
    assert cli(env, "episodes", "list").returncode == 0  # the ledger exists
    path = tmp_path / target
    path.unlink(missing_ok=True)  # a -wal left by the last command is not what this is about
    env["EPISODIC_PROVIDERS_FILE"] = str(path)
    done = cli(env, "init", "--playlist", str(tmp_path / "playlist.yaml"))
    assert not path.exists(), done.stdout
    assert done.returncode == ExitCode.REFUSED, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("ignore", [".gitignore", ".dockerignore"])
def test_init_never_appends_to_the_ledger_through_a_repositorys_ignore_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ignore: str
) -> None:
    """In a team's repository init adds the state folder's line to .gitignore and
    .dockerignore; one that is a symlink to the ledger is refused, the ledger untouched."""
    monkeypatch.delenv("EPISODIC_DATABASE_URL", raising=False)
    team = tmp_path / "team"
    team.mkdir()
    (team / "prefect.yaml").write_text(
        "pull:\n  - episodic.deployments.steps.project_directory: {}\n"
    )
    env = dict(
        os.environ,
        EPISODIC_PROJECT_DIR=str(team),
        EPISODIC_HOME=str(tmp_path / "home"),
        EPISODIC_PROVIDERS_FILE=str(tmp_path / "providers.yaml"),
    )
    assert cli(env, "episodes", "list").returncode == 0  # the ledger exists
    ledger = tmp_path / "home" / "episodic.db"
    before = ledger.read_bytes()
    (team / ignore).symlink_to(ledger)
    done = cli(env, "init")
    assert done.returncode == ExitCode.REFUSED, done
    assert len(done.stderr.strip().splitlines()) == 1 and ignore in done.stderr, done.stderr
    assert ledger.read_bytes() == before
    assert not (team / "playlist.yaml").exists()  # refused before anything was written
