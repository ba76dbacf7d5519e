"""docs/testing-your-pipeline.md's test files run as written, in a scratch team repository
holding the example playlist, with the plugin this checkout installs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from episodic.core.resources import example_playlist
from tests.installed import clean_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing-your-pipeline.md"
_FILE = re.compile(r"^<!-- file: (?P<path>\S+) -->\n```python\n(?P<body>.*?)^```", re.M | re.S)


def documented_files() -> dict[str, str]:
    """``{path: text}`` of every python block marked ``<!-- file: PATH -->`` on the page."""
    return {m["path"]: m["body"] for m in _FILE.finditer(DOC.read_text())}


def test_the_page_has_a_first_test_file() -> None:
    assert list(documented_files()) == ["tests/test_weekly.py"]


def test_the_documented_test_file_passes_in_a_team_repository(tmp_path: Path) -> None:
    team = tmp_path / "team"
    (team / "playlists").mkdir(parents=True)
    shutil.copyfile(example_playlist(), team / "playlists" / "weekly.yaml")
    shutil.copytree(example_playlist().parent / "reference", team / "playlists" / "reference")
    for path, text in documented_files().items():
        (team / path).parent.mkdir(parents=True, exist_ok=True)
        (team / path).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=team,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout
