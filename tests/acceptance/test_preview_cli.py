"""`episodic preview` as a person runs it: the contact sheet's full path on
stdout, `--json`, `--out`, and each refusal one line on stderr with its documented exit code
(docs/cli.md), on SQLite and Postgres."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from tests.generation import write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e


def refused(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stderr
    for word in words:
        assert word in line, line


def test_preview_prints_where_the_sheet_is_and_refuses_in_one_line(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    refused(cli("preview", "2026-W32-0"), 5)  # no such episode
    refused(cli("preview", "2026-W32-x"), 2)  # not an episode id
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    refused(cli("preview", "2026-W32-0"), 2, "has no plan", "episodic plan 2026-W32-0")
    playlist = write_playlist(tmp_path / "pl", ["Opening night", "[[FAIL_PERMANENT]] b"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    refused(cli("preview", "2026-W32-0"), 2, "2 planned images are not completed (v01.p1, v02")
    assert cli("generate", "2026-W32-0").returncode == 6  # one item failed
    refused(cli("preview", "2026-W32-0"), 2, "(v02.p1)", "episodic generate 2026-W32-0")

    fixed = write_playlist(tmp_path / "pl", ["Opening night", "Encore"], hero={2: 2})
    assert cli("plan", "2026-W32-0", "--playlist", str(fixed)).returncode == 0
    assert cli("generate", "2026-W32-0").returncode == 0
    shown = cli("preview", "2026-W32-0")
    assert shown.returncode == 0, shown.stderr
    summary, where = shown.stdout.strip().splitlines()
    assert "3 images" in summary and "v02 1-2" in summary and "--pick" in summary
    home = Path(os.environ.get("EPISODIC_HOME", ""))
    path = Path(where)
    assert path.is_absolute() and path.name == "preview.png" and path.is_file()
    assert path.parent == home / "episodes" / "2026-W32-0"
    with Image.open(path) as sheet:
        assert sheet.format == "PNG"

    out = tmp_path / "review" / "sheet.png"
    answer = json.loads(cli("preview", "2026-W32-0", "--out", str(out), "--json").stdout)
    assert answer["path"] == str(out) and out.is_file()
    assert answer["heroes"] == {"v02": 2} and answer["images"] == 3
    assert [(t["title"], t["label"]) for t in answer["tiles"]] == [
        ("Opening night", "v01.p1"),
        ("Encore", "v02 candidate 1 (pick v02=1)"),
        ("Encore", "v02 candidate 2 (pick v02=2)"),
    ]
    refused(cli("preview", "2026-W32-0", "--out", str(tmp_path)), 2, "--out", "is a folder")
    assert cli("approve", "2026-W32-0", "--by", "ann", "--pick", "v02=2").returncode == 0
    assert cli("preview", "2026-W32-0", "--json").returncode == 0  # a decided one too
    helped = cli("preview", "--help")
    assert helped.returncode == 0 and "--out" in helped.stdout and "--pipeline" in helped.stdout
