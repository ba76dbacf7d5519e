from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

EPISODIC = shutil.which("episodic", path=str(Path(sys.executable).parent))


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed `episodic` command with the test's environment."""
    assert EPISODIC is not None, "the episodic command is not installed in this environment"

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EPISODIC, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **(env or {})},
        )

    return run
