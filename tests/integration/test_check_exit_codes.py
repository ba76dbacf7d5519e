"""`episodic check` exits with its own code for findings, and 1 only when it cannot finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from episodic.core.exit_codes import ExitCode
from episodic.storage.models import CostEntryRow
from tests.generation import new_episode, write_playlist


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from episodic.cli.app import run

    capsys.readouterr()
    code = run(["check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_clean_is_0_and_findings_are_their_own_code(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a"]))
    assert episode.generate().counts.completed == 1
    assert check(capsys, "--all")[:2] == (0, "clean\n")
    with engine.begin() as conn:  # a cost entry that its basis does not make
        conn.execute(update(CostEntryRow).values(amount_micros=1_000_103))
    code, out, err = check(capsys, "--all", "--json")
    assert code == 8 and ExitCode(code) is ExitCode.CHECK_FINDINGS, err
    assert not json.loads(out)["clean"] and err == ""


def test_a_check_that_cannot_read_its_database_is_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = tmp_path / "not-a-database.db"
    garbage.write_bytes(b"this is not an SQLite file, " * 100)
    monkeypatch.setenv("EPISODIC_DATABASE_URL", f"sqlite:///{garbage}")
    code, out, err = check(capsys, "--all")
    assert code == 1 and ExitCode(code) is ExitCode.ERROR, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
