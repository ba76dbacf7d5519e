"""A Prefect API that refuses connections: `prefect setup`, `sweep --prefect` and
`dispatch` say so in one line naming it without its password (exit 1), not `unexpected
ConnectError`."""

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


@pytest.mark.parametrize(
    "args",
    [["prefect", "setup"], ["sweep", "--prefect"], ["dispatch", "generate", "EPISODE"]],
    ids=["prefect-setup", "sweep", "dispatch"],
)
def test_an_unreachable_prefect_api_is_one_line_without_its_password(
    engine: Engine, args: list[str], tmp_path: Path
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    args = [episode.episode_id if arg == "EPISODE" else arg for arg in args]
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert EPISODIC is not None
    env = {**os.environ, "PREFECT_API_URL": f"http://admin:hunter2@127.0.0.1:{port}/api"}
    done = subprocess.run(
        [EPISODIC, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"error: the Prefect API at http://127.0.0.1:{port}/api did not answer (ConnectError)\n"
    ), done.stderr
    assert "hunter2" not in done.stdout
