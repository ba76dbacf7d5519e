"""Several `episodic db upgrade` processes released together on one empty database: one
migrates and says so, the others wait for it and say the schema was already current."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from episodic.storage.schema import HEAD_REVISION, current_revision
from tests.integration.race_workers import run_processes, upgrade_worker

PROCESSES = 4


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_of_concurrent_upgrades_only_the_one_that_migrated_says_upgraded(
    empty_engine: Engine, tmp_path: Path, trial: int
) -> None:
    url = empty_engine.url.render_as_string(hide_password=False)
    said = run_processes(
        [(upgrade_worker, (url, str(tmp_path / f"home-{n}"))) for n in range(PROCESSES)]
    )
    assert [code for code, _ in said] == [0] * PROCESSES, said
    lines = sorted(line for _, line in said)
    assert lines == sorted(
        [f"schema upgraded from empty to {HEAD_REVISION}"]
        + [f"schema already at {HEAD_REVISION}"] * (PROCESSES - 1)
    ), said
    assert current_revision(empty_engine) == HEAD_REVISION
