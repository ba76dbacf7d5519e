"""`episodic media restore|import` as users run them: exit codes, one-line errors, --json."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], lines
    assert "Traceback" not in result.stderr


def test_restore_and_import_from_the_command_line(cli: Cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"EPISODIC_HOME": str(home), "EPISODIC_FAKE_PROVIDER_LOG": str(tmp_path / "log")}
    for command in (["media", "--help"], ["media", "restore", "--help"], ["media", "import", "-h"]):
        assert cli(*command, env=env).returncode == 0, command
    _one_line_error(cli("media", "restore", "2026-W32-4", env=env), 5, "not found")
    _one_line_error(cli("media", "restore", "not-an-id", env=env), 2, "not-an-id")
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", "2026-W32-0", "--playlist", str(playlist)],
        ["generate", "2026-W32-0"],
    ):
        assert cli(*step, env=env).returncode == 0, step
    objects = sorted((home / "media" / "sha256").rglob("*.png"))
    assert len(objects) == 2
    objects[0].unlink()  # the store lost one image
    assert cli("check", "2026-W32-0", env=env).returncode == 8

    restored = cli("media", "restore", "2026-W32-0", "--json", env=env)
    assert restored.returncode == 0, restored.stderr
    report = json.loads(restored.stdout)
    assert report["complete"] and report["paid_calls"] == 0 and report["collected"] == 1
    assert sorted(report["counts"].items()) == [("present", 1), ("restored", 1)]
    assert objects[0].is_file() and cli("check", "2026-W32-0", env=env).returncode == 0
    jobs = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert [e["event"] for e in jobs].count("job_created") == 2  # one per image, ever

    again = cli("media", "restore", "2026-W32-0", env=env)
    assert again.returncode == 0 and "v01.p1: present" in again.stdout
    assert "0 paid calls" in again.stdout.splitlines()[-1]
    nothing = cli("media", "import", env=env)
    assert nothing.returncode == 0 and "nothing to import" in nothing.stdout
    _one_line_error(
        cli(
            "media", "restore", "2026-W32-0", env={**env, "EPISODIC_MEDIA_URL": str(tmp_path / "x")}
        ),
        2,
        "no such folder",
    )


def test_readers_refuse_a_store_folder_that_does_not_exist(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """`check` and `episodes show` on a store that is not there say so in one line (exit 2),
    as `media restore` does, instead of reporting every image missing (on both backends)."""
    home = tmp_path / "home"
    env = {"EPISODIC_HOME": str(home), "EPISODIC_FAKE_PROVIDER_LOG": str(tmp_path / "log")}
    playlist = write_playlist(tmp_path / "pl", ["a"])
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", "2026-W32-0", "--playlist", str(playlist)],
        ["generate", "2026-W32-0"],
    ):
        assert cli(*step, env=env).returncode == 0, step
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    for url in (str(tmp_path / "nodir"), str(not_a_folder), "/dev/null"):
        wrong = {**env, "EPISODIC_MEDIA_URL": url}
        for command in (
            ["check", "2026-W32-0"],
            ["check", "--all"],
            ["episodes", "show", "2026-W32-0"],
            ["media", "restore", "2026-W32-0"],
        ):
            _one_line_error(cli(*command, env=wrong), 2, f"media store {url}: no such folder")
    assert not (tmp_path / "nodir").exists()
    assert cli("check", "2026-W32-0", env=env).returncode == 0


def test_a_relative_store_is_the_projects_not_the_shells(cli: Cli, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "store").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "episodic"\n')
    env = {
        "EPISODIC_HOME": str(tmp_path / "home"),
        "EPISODIC_PROJECT_DIR": str(project),
        "EPISODIC_MEDIA_URL": "store",
    }
    assert cli("allocate", "--key", "k", "--week", "2026-W32", env=env).returncode == 0
    cwd = tmp_path / "elsewhere"
    (cwd / "store").mkdir(parents=True)  # a folder of that name where the shell is
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    shown = subprocess.run(
        [EPISODIC, "episodes", "show", "2026-W32-0", "--json"],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["media_store"] == str(project / "store")
    refused = [
        ("file://relative/x", "host"),
        ("s3://BRK_bad/x", "bucket"),
        ("s3://brk/../x", "'..'"),
        ("s3://brk/x\x07", "control character"),
    ]
    for url, text in refused:
        _one_line_error(cli("check", "--all", env={**env, "EPISODIC_MEDIA_URL": url}), 2, text)
