"""Spawned workers of the budget races (tests/integration/test_budgets.py): each runs one real
`episodic` command once every worker is ready (a multiprocessing Barrier)."""

from __future__ import annotations

from typing import Any


def cli_worker(barrier: Any, args: list[str], env: dict[str, str], results: Any) -> None:
    """`episodic *args` as a process of its own, released with every other worker."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    command = [str(Path(sys.executable).parent / "episodic"), *args]
    barrier.wait(timeout=120)
    done = subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=240
    )
    results.put((args, done.returncode, done.stdout, done.stderr))
