"""Assembly on two machines' worth of fresh directories gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import stored_image_file, write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e


def test_two_fresh_homes_assemble_identical_bytes(cli: Cli, tmp_path: Path) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    hashes = []
    for machine in ("one", "two"):
        env = {"EPISODIC_HOME": str(tmp_path / machine)}
        steps = [
            ["allocate", "--key", "k", "--week", "2026-W32"],
            ["plan", "2026-W32-0", "--playlist", str(playlist)],
            ["generate", "2026-W32-0"],
            ["approve", "2026-W32-0", "--by", "ann"],
        ]
        for step in steps:
            result = cli(*step, env=env)
            assert result.returncode == 0, (step, result.stderr)
        assembled = json.loads(cli("assemble", "2026-W32-0", "--json", env=env).stdout)
        folder = tmp_path / machine / "episodes" / "2026-W32-0"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert (
            hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
            == (assembled["manifest_sha256"])
        )
        hashes.append(
            (
                assembled["cover_sha256"],
                hashlib.sha256((folder / "cover.png").read_bytes()).hexdigest(),
                _without_remote_refs(manifest),
            )
        )
    # Two homes are two installations: the provider's jobs (their remote references) are
    # each one's own (issue 28); everything else the approved inputs decide is identical.
    assert hashes[0] == hashes[1]
    assert hashes[0][0] == hashes[0][1]


def _without_remote_refs(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_remote_refs(v) for k, v in value.items() if k != "remote_ref"}
    if isinstance(value, list):
        return [_without_remote_refs(v) for v in value]
    return value


def test_review_commands_refuse_out_of_order(cli: Cli, tmp_path: Path) -> None:
    env = {"EPISODIC_HOME": str(tmp_path / "h")}
    assert cli("approve", "2026-W32-0", "--by", "ann", env=env).returncode == 5
    assert cli("allocate", "--key", "k", "--week", "2026-W32", env=env).returncode == 0
    refused = cli("approve", "2026-W32-0", "--by", "ann", env=env)
    assert refused.returncode == 2 and "only a generated episode" in refused.stderr
    assert cli("assemble", "2026-W32-0", env=env).returncode == 2
    assert cli("approve", "2026-W32-0", "--reject", "--by", "ann", env=env).returncode == 2


def test_check_exit_codes(cli: Cli, tmp_path: Path) -> None:
    env = {"EPISODIC_HOME": str(tmp_path / "h")}
    playlist = write_playlist(tmp_path / "pl", ["a"])
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", "2026-W32-0", "--playlist", str(playlist)],
        ["generate", "2026-W32-0"],
    ):
        assert cli(*step, env=env).returncode == 0
    assert cli("check", env=env).returncode == 2  # neither an id nor --all
    assert cli("check", "--all", env=env).stdout.strip() == "clean"
    assert cli("check", "2026-W32-4", env=env).returncode == 5
    image = stored_image_file(f"sqlite:///{tmp_path / 'h' / 'episodic.db'}", tmp_path / "h", "v01")
    image.write_bytes(b"tampered")
    result = cli("check", "2026-W32-0", "--json", env=env)
    assert result.returncode == 1
    assert json.loads(result.stdout)["findings"][0]["check"] == "files"


def test_migrate_legacy_dry_run_then_apply(cli: Cli, tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "legacy"
    env = {"EPISODIC_HOME": str(tmp_path / "h")}
    dry = cli("migrate-legacy", str(example), "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    assert {e["action"] for e in json.loads(dry.stdout)["episodes"]} == {"would import"}
    assert json.loads(cli("episodes", "list", "--json", env=env).stdout) == []
    applied = json.loads(cli("migrate-legacy", str(example), "--apply", "--json", env=env).stdout)
    assert [e["episode_id"] for e in applied["episodes"]] == ["2026-W30-0", "2026-W31-0"]
    assert cli("check", "--all", env=env).stdout.strip() == "clean"
    assert cli("migrate-legacy", str(tmp_path / "nowhere"), env=env).returncode == 2


def test_assemble_of_an_image_tampered_after_approval_is_refused_in_one_line(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """Issue 28: the bytes of an approved image change on disk; `assemble` exits 2 (refused,
    nothing written, as docs/cli.md's table says) with one line naming the image and the
    next step, never a traceback; with the file put back it assembles."""
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", "2026-W32-0", "--playlist", str(playlist)],
        ["generate", "2026-W32-0"],
        ["approve", "2026-W32-0", "--by", "ann"],
    ):
        assert cli(*step).returncode == 0, step
    folder = tmp_path / "home" / "episodes" / "2026-W32-0"
    image = stored_image_file(database_url, tmp_path / "home", "v02")
    original = image.read_bytes()
    image.write_bytes(original + b"tampered")
    refused = cli("assemble", "2026-W32-0")
    assert refused.returncode == 2, refused
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: ") and "image v02.p1" in line and "episodic check" in line
    assert "Traceback" not in refused.stderr and not (folder / "manifest.json").exists()
    assert json.loads(cli("episodes", "show", "2026-W32-0", "--json").stdout)["state"] == (
        "approved"
    )
    image.write_bytes(original)
    assert cli("assemble", "2026-W32-0").returncode == 0
