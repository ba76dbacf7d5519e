"""Where state lives (`core.home`): the project's state folder whatever the working directory,
the user's data folder for an installation that is not a checkout, a relative EPISODIC_HOME
anchored at the project; and `make clean` never touching it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from episodic.core.home import installed_project, resolve_home, user_data_folder
from episodic.core.settings import load_settings

PROJECT = Path(__file__).resolve().parents[2]


def _package(root: Path, pyproject: str | None) -> Path:
    """``root/core/home.py`` (empty), with ``root/pyproject.toml`` when given."""
    (root / "core").mkdir(parents=True)
    module = root / "core" / "home.py"
    module.write_text("")
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return module


def test_a_checkout_is_its_project_folder(tmp_path: Path) -> None:
    module = _package(tmp_path / "clone", '[project]\nname = "episodic"\nversion = "0.1.0"\n')
    assert installed_project(module) == tmp_path / "clone"
    link = tmp_path / "mounted"
    link.symlink_to(tmp_path / "clone", target_is_directory=True)
    assert installed_project(link / "core" / "home.py") == tmp_path / "clone"  # resolved


@pytest.mark.parametrize("pyproject", [None, '[project]\nname = "other"\n', "\xff not text"])
def test_site_packages_or_another_project_is_none(tmp_path: Path, pyproject: str | None) -> None:
    assert installed_project(_package(tmp_path / "site-packages", pyproject)) is None


def test_this_checkout_is_found_and_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPISODIC_HOME")  # computed only: nothing is created
    assert load_settings().home_path == PROJECT / ".episodic"
    assert load_settings().url == f"sqlite:///{PROJECT / '.episodic' / 'episodic.db'}"
    monkeypatch.setenv("EPISODIC_HOME", "")
    assert load_settings().home_path == PROJECT / ".episodic"


def test_relative_home_is_anchored_at_the_project(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPISODIC_HOME", "state/x")
    assert load_settings().home_path == PROJECT / "state" / "x"
    assert resolve_home(".episodic") == PROJECT / ".episodic"
    assert resolve_home(tmp_path / "abs") == tmp_path / "abs"
    (tmp_path / "mount").mkdir()
    (tmp_path / "mount" / "pyproject.toml").write_text('[project]\nname = "episodic"\n')
    monkeypatch.setenv("EPISODIC_PROJECT_DIR", str(tmp_path / "mount"))
    assert resolve_home("state") == tmp_path / "mount" / "state"
    assert resolve_home(None) == tmp_path / "mount" / ".episodic"


def test_user_data_folder_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert user_data_folder() == tmp_path / "data" / "episodic"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the spec: absolute paths only
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert user_data_folder() == tmp_path / "me" / ".local" / "share" / "episodic"


def test_make_clean_removes_build_artefacts_only() -> None:
    plan = subprocess.run(
        ["make", "-n", "clean"], cwd=PROJECT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert ".pytest_cache" in plan and "__pycache__" in plan
    assert ".episodic" not in plan and "episodic.db" not in plan
    state = subprocess.run(
        ["make", "-n", "clean-state"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "episodic state remove --yes" in state and "rm " not in state
