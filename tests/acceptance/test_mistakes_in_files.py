"""Ordinary mistakes and hostile files get one answer with the documented exit code."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.acceptance.conftest import EPISODIC
from tests.generation import write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _alias_bomb(path: Path, levels: int) -> Path:
    """A playlist of under 1 kB whose one title is an alias fanning out 9**levels strings."""
    lines = [
        "template: {id: t, version: 1, prompt: 'cover {title}'}",
        "provider_profile: fake",
        "a0: &a0 [x, x, x, x, x, x, x, x, x]",
    ]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    lines += ["items:", "  - video_id: v01", f"    title: *a{levels - 1}", "    seed: 1"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _limit_memory() -> None:  # 1 GiB of address space: a mistake is never worth more
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@SQLITE_ONLY
def test_a_yaml_alias_bomb_is_a_mistake_not_an_out_of_memory(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """An alias fanning out (9**9 strings, from 700 bytes) would take gigabytes if
    expanded in full (under a 1 GiB limit: `unexpected MemoryError`, exit 1). `plan` refuses
    the playlist in one message, exit 2, within the limit."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    bomb = _alias_bomb(tmp_path / "bomb.yaml", levels=9)
    assert bomb.stat().st_size < 1000
    assert EPISODIC is not None
    result = subprocess.run(
        [EPISODIC, "plan", "2026-W32-0", "--playlist", str(bomb)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        preexec_fn=_limit_memory,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("error: playlist "), result.stderr
    assert "MemoryError" not in result.stderr, result.stderr


@SQLITE_ONLY
def test_plan_refuses_a_providers_file_that_does_not_exist(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """docs/providers.md: a named EPISODIC_PROVIDERS_FILE that does not exist is refused by
    every command that loads profiles, `plan` too: exit 2, naming the missing file
    rather than answering `'real' is not a provider profile (known: fake)`,
    which would hide the real mistake."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    missing = str(tmp_path / "nope.yaml")
    for profile in ("fake", "real"):
        playlist = write_playlist(tmp_path / profile, ["a"], profile=profile)
        result = cli(
            "plan",
            "2026-W32-0",
            "--playlist",
            str(playlist),
            env={"EPISODIC_PROVIDERS_FILE": missing},
        )
        assert result.returncode == 2, (profile, result.returncode, result.stdout)
        assert "EPISODIC_PROVIDERS_FILE" in result.stderr and missing in result.stderr, (
            profile,
            result.stderr,
        )


@SQLITE_ONLY
def test_an_empty_only_selects_nothing_rather_than_everything(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """`--only ' '` and `--only ,` are refused (an empty entry), and so is `--only ''` (a
    script's unset variable: `--only "$PICK"`), rather than selecting every video and buying
    them all."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    result = cli("generate", "2026-W32-0", "--only", "")
    assert result.returncode == 2, (result.returncode, result.stdout)
    assert "--only" in result.stderr, result.stderr
    assert (
        not (tmp_path / "provider.jsonl").exists()
        or not (tmp_path / "provider.jsonl").read_text().strip()
    ), "paid calls were made"


@SQLITE_ONLY
def test_an_empty_playlist_is_said_in_plain_words(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """An empty file is called empty, not `the playlist must be a mapping ... not None`
    (Python's word)."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    result = cli("plan", "2026-W32-0", "--playlist", str(empty))
    assert result.returncode == 2, result.stderr
    assert "None" not in result.stderr and "empty" in result.stderr, result.stderr
