"""No path a user names on the command line writes over the record: `preview --out`,
`assemble --out` and `init --playlist` naming the SQLite ledger (or its write-ahead log), a
paid image in the local media store, the providers file or anything in the state folder are
refused in one line (exit 2), and every paid call the ledger recorded is still there."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stderr, line
    for word in words:
        assert word in line, line


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def test_no_output_named_on_the_command_line_writes_over_the_record(
    cli: Cli, database_url: str, tmp_path: Path, backend: str
) -> None:
    home = Path(os.environ["EPISODIC_HOME"])
    assert cli("init", "--playlist", str(tmp_path / "starter.yaml")).returncode == 0
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    assert cli("generate", "2026-W32-0").returncode == 0
    assert cli("approve", "2026-W32-0", "--by", "ann").returncode == 0
    shown = json.loads(cli("episodes", "show", "2026-W32-0", "--json").stdout)
    paid_image = Path(shown["media_store"]) / shown["media"][0]["key"]
    targets = {
        "the providers file": home / "providers.yaml",
        "a paid image": paid_image,
        "a file of the state folder": home / "notes.png",
    }
    if backend == "sqlite":
        ledger = Path(database_url.removeprefix("sqlite:///"))
        targets["the ledger"] = ledger
        targets["its write-ahead log"] = Path(f"{ledger}-wal")
    before = {what: _digest(path) for what, path in targets.items()}
    for what, target in targets.items():
        _refused(cli("preview", "2026-W32-0", "--out", str(target)), "--out", "nothing was written")
        relative = os.path.relpath(target, tmp_path)  # from elsewhere, by another way
        done = subprocess.run(
            [*_episodic(), "preview", "2026-W32-0", "--out", relative],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=os.environ.copy(),
            timeout=120,
        )
        _refused(done, "nothing was written")
        _refused(cli("init", "--playlist", str(target)), "--playlist")
        if what == "its write-ahead log":  # SQLite's own: made and emptied by any command
            assert not target.exists() or not target.read_bytes().startswith(b"\x89PNG")
        else:
            assert _digest(target) == before[what], what
    _refused(cli("assemble", "2026-W32-0", "--out", str(home / "copy")), "the state folder")
    assert not (home / "copy").exists()
    store = Path(shown["media_store"])
    _refused(cli("assemble", "2026-W32-0", "--out", str(store / "copy")), "the media store")
    again = json.loads(cli("episodes", "show", "2026-W32-0", "--json").stdout)
    assert again["state"] == "approved"  # nothing was assembled by a refused command
    runs = json.loads(cli("runs", "list", "--episode", "2026-W32-0", "--json").stdout)
    assert [r["paid_submissions"] for r in runs] == [3], runs  # the paid calls are recorded
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout
    assert cli("assemble", "2026-W32-0", "--out", str(tmp_path / "copy")).returncode == 0


def _episodic() -> list[str]:
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    return [EPISODIC]
