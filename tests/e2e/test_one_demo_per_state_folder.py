"""Two `episodic demo --ui` at once in one state folder. Each would start its own Prefect
server on the same Prefect database and register the deployment's schedule, so the
deployment would end with two schedules: the Monday slot run twice, one demo's story telling
`slot 2 (Mon ...): WEEK-0`, and each demo paying for its own waiting episode, although
docs/cli.md says a later `demo --ui` shows the run still waiting rather than paying for
another episode. The second demo starts one second after the first, the start that races
most often."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.stack import merged_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
EPISODIC = Path(sys.executable).with_name("episodic")
WEEK = "2026-W49"


class _Demo:
    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [str(EPISODIC), "demo", "--ui", "--week", WEEK],
            cwd=PROJECT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops the server"):
                self.ready.set()
        self.ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=120)


def test_a_second_demo_on_one_state_folder_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    """One demo per state folder at a time (`demo/running.lock`). The second,
    started while the first one's server is up, is refused at once in one line (exit 2)
    and buys nothing; the first tells both slots and leaves one episode waiting."""
    home = tmp_path / "home"
    env = merged_env(
        {"EPISODIC_HOME": str(home), "EPISODIC_DATABASE_URL": f"sqlite:///{home / 'episodic.db'}"}
    )
    first = _Demo(env)
    time.sleep(1)  # the reproduction's stagger (a second terminal); no assertion on time
    second = _Demo(env)
    try:
        assert second.proc.wait(timeout=300) == 2, "\n".join(second.lines[-30:])
        assert second.proc.stderr is not None
        err = second.proc.stderr.read()
        assert err.count("\n") == 1 and "another `episodic demo` is running" in err, err
        assert first.ready.wait(timeout=500), "\n".join(first.lines[-30:])
    finally:
        for demo in (first, second):
            demo.stop()
    story = [line for line in first.lines if line.startswith("  slot ")]
    assert any(line.startswith("  slot 2 (Thu ") for line in story), story
    assert any(f"{WEEK}-1" in line for line in story), story
    listed = subprocess.run(
        [str(EPISODIC), "episodes", "list", "--week", WEEK, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    episodes = sorted(json.dumps(e) for e in json.loads(listed.stdout))
    assert len(episodes) == 3, episodes  # the two slots and one run waiting for approval
