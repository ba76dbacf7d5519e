"""Assembly on two machines' worth of fresh directories gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import write_playlist
from tests.media_targets import open_target

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
        folder = tmp_path / f"{machine}-copy"  # a local copy (never in the state folder)
        assembled = json.loads(
            cli("assemble", "2026-W32-0", "--out", str(folder), "--json", env=env).stdout
        )
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
    # each one's own; everything else the approved inputs decide is identical.
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
    image = _stored_file(cli, "2026-W32-0", "v01.p1", env)
    image.write_bytes(b"tampered")  # behind the (local) media store's back
    result = cli("check", "2026-W32-0", "--json", env=env)
    assert result.returncode == 8
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
    """The bytes of an approved image change on disk; `assemble` exits 2 (refused,
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
    image = _stored_file(cli, "2026-W32-0", "v02.p1", {})
    original = image.read_bytes()
    image.write_bytes(original + b"tampered")
    refused = cli("assemble", "2026-W32-0")
    assert refused.returncode == 2, refused
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: ") and "image v02.p1" in line and "episodic check" in line
    assert "Traceback" not in refused.stderr
    shown = json.loads(cli("episodes", "show", "2026-W32-0", "--json").stdout)
    assert shown["state"] == "approved"
    assert {m["name"] for m in shown["media"]} == {"v01.p1", "v02.p1"}  # no cover, no manifest
    image.write_bytes(original)
    assert cli("assemble", "2026-W32-0").returncode == 0


def _stored_file(cli: Cli, episode_id: str, name: str, env: dict[str, str]) -> Path:
    """The local media store's file holding the medium `name` of the episode (its key as
    `episodes show` lists it), to tamper with it behind the store's back."""
    shown = json.loads(cli("episodes", "show", episode_id, "--json", env=env).stdout)
    [medium] = [m for m in shown["media"] if m["name"] == name]
    assert medium["stored"] == "yes"
    return Path(shown["media_store"]) / medium["key"]


def test_generated_on_one_machine_then_approved_and_assembled_on_another(
    cli: Cli,
    database_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Generate on machine A (its own state folder) with an S3 store and a
    shared database; A's folder is deleted; machine B (another state folder) approves,
    assembles and checks from the store alone, and generating again pays nothing."""
    media = open_target("s3", request, tmp_path, monkeypatch)  # both machines' environment
    # the provider's side is shared by both machines, as a remote provider's is
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_DIR", str(tmp_path / "provider-jobs"))
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    machine_a = {"EPISODIC_HOME": str(tmp_path / "machine-a")}
    for step in (
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["plan", "2026-W32-0", "--playlist", str(playlist)],
        ["generate", "2026-W32-0"],
    ):
        result = cli(*step, env=machine_a)
        assert result.returncode == 0, (step, result.stderr)
    # the generating machine and its disk are gone (it may have written nothing there)
    shutil.rmtree(tmp_path / "machine-a", ignore_errors=True)
    machine_b = {"EPISODIC_HOME": str(tmp_path / "machine-b")}
    shown = json.loads(cli("episodes", "show", "2026-W32-0", "--json", env=machine_b).stdout)
    assert shown["media_store"] == media.url
    assert [m["stored"] for m in shown["media"]] == ["yes"] * 3
    approved = cli("approve", "2026-W32-0", "--by", "ann", env=machine_b)
    assert approved.returncode == 0, approved.stderr
    out = tmp_path / "machine-b-copy"
    assembled = cli("assemble", "2026-W32-0", "--out", str(out), "--json", env=machine_b)
    assert assembled.returncode == 0, assembled.stderr
    result = json.loads(assembled.stdout)
    store = media.store()
    assert hashlib.sha256(store.read(result["cover"])).hexdigest() == result["cover_sha256"]
    assert (out / "manifest.json").read_bytes() == store.read(result["manifest"])
    for item in json.loads((out / "manifest.json").read_bytes())["items"]:
        assert hashlib.sha256(store.read(item["key"])).hexdigest() == item["sha256"]
    checked = cli("check", "--all", env=machine_b)
    assert (checked.returncode, checked.stdout.strip()) == (0, "clean"), checked.stdout
    again = json.loads(cli("generate", "2026-W32-0", "--json", env=machine_b).stdout)
    assert again["paid_submissions"] == 0
    assert not (tmp_path / "machine-b" / "episodes").exists()  # nothing was kept locally
