"""Ordinary mistakes get right answers: one line (or one message) on stderr with
the documented exit code, in the project's own words."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


@SQLITE_ONLY
def test_plan_refuses_an_unknown_provider_profile_naming_the_known_ones(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a"], profile="fak")
    result = cli("plan", "2026-W32-0", "--playlist", str(playlist))
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "'fak'" in lines[0] and "known: fake" in lines[0], lines[0]
    assert "no plan" in cli("generate", "2026-W32-0").stderr  # nothing was recorded


@SQLITE_ONLY
@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", "", " 0 "])
def test_episodic_debug_off_words_print_no_traceback(
    cli: Cli, database_url: str, value: str
) -> None:
    result = cli("runs", "show", "not-a-run", env={"EPISODIC_DEBUG": value})
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "warning" not in result.stderr, result.stderr


@SQLITE_ONLY
@pytest.mark.parametrize("value", ["1", "TRUE", "yes", "On"])
def test_episodic_debug_on_words_print_the_traceback(
    cli: Cli, database_url: str, value: str
) -> None:
    result = cli("runs", "show", "not-a-run", env={"EPISODIC_DEBUG": value})
    assert result.returncode == 2 and "Traceback" in result.stderr, result.stderr


@SQLITE_ONLY
def test_episodic_debug_that_is_no_boolean_warns_once_and_stays_off(
    cli: Cli, database_url: str
) -> None:
    result = cli("runs", "show", "not-a-run", env={"EPISODIC_DEBUG": "maybe"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "EPISODIC_DEBUG='maybe'" in warnings[0], result.stderr


@SQLITE_ONLY
def test_every_mistake_of_a_playlist_is_shown_with_its_video_in_plain_words(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = tmp_path / "x.yaml"
    playlist.write_text(
        "template: {id: t, version: 1, prompt: '{title}'}\n"
        "items:\n"
        "  - {video_id: v01, title: a, seed: 1}\n"
        "  - {video_id: v02, titel: b, seed: 2}\n"  # a typo: title missing, titel unknown
        "  - {video_id: v03, title: c, seed: -3}\n"
        "  - {video_id: 'bad id', title: d, seed: 4}\n"
        "  - {video_id: v01, title: e, seed: 'five'}\n"
    )
    result = cli("plan", "2026-W32-0", "--playlist", str(playlist))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"error: playlist {playlist}: 6 mistakes:", lines
    assert lines[1:] == [
        "  video v02 (item 2): title is missing",
        "  video v02 (item 2): titel is not a field here (did you mean title? fields: "
        "video_id, title, parts, seed, hero)",
        "  video v03 (item 3): seed must be at least 0, not -3",
        "  item 4: video_id 'bad id' is not an id: 1 to 64 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit",
        "  video v01 (item 5): seed must be a whole number, not 'five'",
        "  video v01 (items 1, 5): the video_id appears more than once (each video needs its own)",
    ], lines
    for pydantic_words in ("Field required", "Value error", "Input should be", "items.1"):
        assert pydantic_words not in result.stderr


@SQLITE_ONLY
def test_one_playlist_mistake_is_one_line(cli: Cli, database_url: str, tmp_path: Path) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = tmp_path / "x.yaml"
    playlist.write_text(
        "template: {id: t, version: 1, prompt: '{title}'}\n"
        "items:\n  - {video_id: v01, title: a, seed: 1, hero: 3}\n"
    )
    result = cli("plan", "2026-W32-0", "--playlist", str(playlist))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: playlist {playlist}: video v01 (item 1): hero is {{candidates: N}} or false"
    ]


@SQLITE_ONLY
def test_only_takes_video_ids_and_says_a_reversed_range_is_reversed(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    by_id = cli("generate", "2026-W32-0", "--only", "v02,v03", "--plan", "--json")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["new_calls"] == 2
    reversed_ = cli("generate", "2026-W32-0", "--only", "3-1", "--plan")
    assert reversed_.returncode == 2
    assert "range 3-1 is reversed: write 1-3" in reversed_.stderr, reversed_.stderr
    unknown = cli("generate", "2026-W32-0", "--only", "v2", "--plan")
    assert unknown.returncode == 2 and "(close: v02" in unknown.stderr, unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
