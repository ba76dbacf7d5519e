"""A second copy of the project folder with its own installed `episodic` command.

The copy holds the project's packages and its ``pyproject.toml`` (what marks a checkout), and a
virtualenv of its own (``python -m venv``) whose code is the copy's: a ``.pth`` puts the copy
first on ``sys.path`` and adds this checkout's ``site-packages`` for the locked dependencies
(nothing is downloaded). Its ``.venv/bin/episodic`` is the console script an editable install
writes, so ``episodic.core.__file__`` resolves into the copy as in a clone after ``uv sync``.
`make_site_install` is the other kind: the packages inside a virtualenv's ``site-packages``,
as ``pip install .`` leaves them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from bench.house import PRODUCT_PACKAGES

PROJECT = Path(__file__).resolve().parents[1]
PACKAGES = PRODUCT_PACKAGES


@dataclass(frozen=True)
class ProjectCopy:
    folder: Path

    @property
    def python(self) -> Path:
        return self.folder / ".venv" / "bin" / "python"

    @property
    def episodic(self) -> Path:
        return self.folder / ".venv" / "bin" / "episodic"


def make_project_copy(dest: Path) -> ProjectCopy:
    """Copy the project to ``dest`` (which must not exist) and install it there: the folders
    and ``episodic/`` with its links to them, as in a clone."""
    dest.mkdir(parents=True)
    _copy_packages(dest)
    shutil.copytree(PROJECT / "episodic", dest / "episodic", symlinks=True)
    shutil.copytree(PROJECT / "examples", dest / "examples")
    shutil.copy2(PROJECT / "pyproject.toml", dest / "pyproject.toml")
    site = _venv(dest / ".venv")
    (site / "00_episodic_copy.pth").write_text(f"{dest}\n{_DEPENDENCIES}")
    return _with_console_script(ProjectCopy(dest))


def make_site_install(dest: Path) -> ProjectCopy:
    """A non-editable install (what ``pip install .`` makes): a virtualenv at ``dest`` whose
    ``site-packages`` holds the package itself (``episodic/core``, ...: ``dest/.venv``), and
    no checkout."""
    dest.mkdir(parents=True)
    site = _venv(dest / ".venv")
    _copy_packages(site / "episodic")
    shutil.copy2(PROJECT / "episodic" / "__init__.py", site / "episodic" / "__init__.py")
    shutil.copytree(PROJECT / "examples", site / "episodic" / "examples")
    (site / "00_episodic_deps.pth").write_text(_DEPENDENCIES)
    return _with_console_script(ProjectCopy(dest))


# This checkout's site-packages for the locked dependencies; its own .pth files (the editable
# install of this checkout among them) are processed after the copy's path.
_DEPENDENCIES = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"


def _copy_packages(into: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(
            PROJECT / package, into / package, ignore=shutil.ignore_patterns("__pycache__")
        )


def _venv(venv: Path) -> Path:
    """A new virtualenv without pip; its site-packages folder."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _with_console_script(copy: ProjectCopy) -> ProjectCopy:
    copy.episodic.write_text(
        f"#!{copy.python}\nimport sys\nfrom episodic.cli.entry import main\nsys.exit(main())\n"
    )
    copy.episodic.chmod(0o755)
    return copy


def run_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``EPISODIC_*`` or ``PREFECT_HOME`` variable (a
    shell that set none), plus ``extra``."""
    dropped = ("PREFECT_HOME", "PYTHONPATH")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_") and k not in dropped
    }
    env.update(extra)
    return env
