"""`episodic init` reports `kept` only of a file that is there: a file it cannot write is
refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_starter_files import cli


def test_init_under_a_file_is_refused_not_reported_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--playlist notes.txt/playlist.yaml` where notes.txt is a file: mkdir raises
    FileExistsError, which must not be read as "another process made the file meanwhile"
    (`playlist: kept`, exit 0, of a file that does not and cannot exist). Documented
    (cli.md, the docstring): exit 2 when a file cannot be written, e.g. its folder is a
    file."""
    (tmp_path / "notes.txt").write_text("a file")
    playlist = tmp_path / "notes.txt" / "playlist.yaml"
    code, out, err = cli(capsys, "init", "--playlist", str(playlist), "--json")
    assert code == 2, out
    assert err.startswith("error: playlist file ") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("target", ["folder", "dangling symlink"])
def test_init_does_not_call_a_folder_or_a_dangling_link_a_kept_providers_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    target: str,
) -> None:
    """EPISODIC_PROVIDERS_FILE naming a folder (or `--playlist .`), or the default
    providers.yaml a dangling symlink, is no kept providers file: every command refuses the
    folder ("does not exist or is not a file ... `episodic init` writes one"), and the
    dangling default is read as no file at all (only the built-in profiles, silently). So
    init exits 2 with one line naming the path, or writes the file."""
    path = tmp_path / "providers.yaml"
    if target == "folder":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "gone.yaml")
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    code, out, _ = cli(capsys, "init", "--playlist", str(tmp_path / "p.yaml"), "--json")
    if code == 0:
        (providers, _playlist) = json.loads(out)["files"]
        assert providers["status"] == "written" and (tmp_path / "gone.yaml").is_file(), out
    else:
        assert code == 2
