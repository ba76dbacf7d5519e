"""The `prefect:` line of `episodic approve` names the Prefect API it could not reach,
without its password."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.generation import new_episode, write_playlist

pytestmark = pytest.mark.e2e

EPISODIC = shutil.which("episodic", path=str(Path(sys.executable).parent))


def test_approve_never_prints_the_password_of_the_prefect_api_url(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """A Prefect server behind a proxy with basic auth is reached as
    PREFECT_API_URL=https://user:PASSWORD@host/api. When it does not answer, approve's
    `prefect:` line (and --json) names it without the password, which would otherwise land
    in a terminal, a CI log, a chat paste; the project names every URL that way (exit 5's
    database URL)."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    assert episode.generate().exit_code == 0
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert EPISODIC is not None
    env = {**os.environ, "PREFECT_API_URL": f"http://admin:hunter2@127.0.0.1:{port}/api"}
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [EPISODIC, "approve", episode.episode_id, "--by", "ann", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "did not answer" in done.stdout, done.stdout
        assert "hunter2" not in done.stdout + done.stderr, done.stdout
