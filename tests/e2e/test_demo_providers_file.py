"""`episodic demo` with EPISODIC_PROVIDERS_FILE naming a file that does not exist: refused in
one line before any flow runs (inside the flow, Prefect logged its traceback first)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.stack import merged_env
from tests.e2e.test_demo import EPISODIC, PROJECT, WEEK

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_demo_with_a_missing_providers_file_is_one_line_and_no_traceback(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    missing = tmp_path / "no-such-providers.yaml"
    env = merged_env(
        {
            "EPISODIC_HOME": str(home),
            "EPISODIC_DATABASE_URL": f"sqlite:///{home / 'episodic.db'}",
            "EPISODIC_PROVIDERS_FILE": str(missing),
        }
    )
    done = subprocess.run(
        [str(EPISODIC), "demo", "--week", WEEK],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: EPISODIC_PROVIDERS_FILE: {missing} does not exist")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "flow run" not in done.stdout, done.stdout
