"""Where this installation keeps its state: the project's state folder, whatever the working
directory a command starts in.

The state folder (``EPISODIC_HOME``) holds the SQLite ledger, the pipeline's lock files, the
paid images, ``providers.yaml``, Prefect's home and the item results. Following the working
directory would let a command started elsewhere (a cron job runs from ``$HOME``) create an
empty ledger there and pay again for what is already paid, so the default is anchored to the
*project*: the folder this installation's code lives in.

- The project folder is ``EPISODIC_PROJECT_DIR`` when set (a worker whose clone is mounted
  somewhere; the same variable the deployments' pull step reads), else the checkout holding
  the imported ``core`` package: ``uv sync`` / ``make bootstrap`` install the project in
  editable mode, so ``core/__file__`` is inside the checkout, and the checkout is recognised
  by its ``pyproject.toml`` naming the project ``episodic``.
- A non-editable install (``pip install .`` into some virtualenv) has no project folder: its
  code lives in ``site-packages``, which must never hold state (a reinstall or a new
  virtualenv would lose the ledger). Its default is the per-user data folder of the platform's
  standard location (``$XDG_DATA_HOME/episodic``, by default ``~/.local/share/episodic``;
  ``~/Library/Application Support/episodic`` on macOS; ``%LOCALAPPDATA%\\episodic`` on
  Windows): one place per user, whatever the working directory, so it can never silently start
  a second ledger either.
- A relative ``EPISODIC_HOME`` is relative to the project folder (where a worker's pull step
  already runs its flows), so ``EPISODIC_HOME=.episodic`` means the same folder from every
  working directory; without a project folder it is relative to the working directory, as any
  path.

Nothing here raises or creates folders: `core.settings` validates the result.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

STATE_FOLDER = ".episodic"
PROJECT_NAME_RE = re.compile(r'^name\s*=\s*"episodic"\s*$', re.MULTILINE)


def installed_project(module_file: str | os.PathLike[str]) -> Path | None:
    """The project checkout holding the package whose module is ``module_file`` (a file of
    a top-level package such as ``core/home.py``), or None when that folder is not one (no
    ``pyproject.toml`` naming the project ``episodic`` beside the package: a non-editable
    install's ``site-packages``). Symlinks are resolved."""
    folder = Path(module_file).resolve().parents[1]
    try:
        text = (folder / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return folder if PROJECT_NAME_RE.search(text) else None


def project_folder() -> Path | None:
    """``EPISODIC_PROJECT_DIR`` (absolute) when set, else the checkout of this installation's
    code (`installed_project`), else None (a non-editable install)."""
    configured = os.environ.get("EPISODIC_PROJECT_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    return installed_project(__file__)


def user_data_folder() -> Path:
    """This user's data folder for episodic, by the platform's standard location."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "episodic"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "episodic"
    xdg = os.environ.get("XDG_DATA_HOME")
    base_path = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local/share"
    return base_path / "episodic"


def default_home() -> Path:
    """The state folder when ``EPISODIC_HOME`` is unset: ``PROJECT/.episodic``, or the user
    data folder without a project folder."""
    project = project_folder()
    return project / STATE_FOLDER if project is not None else user_data_folder()


def resolve_home(value: str | os.PathLike[str] | None) -> Path:
    """The absolute state folder for an ``EPISODIC_HOME`` value (None or empty: the default).
    ``~`` is expanded; a relative value is anchored at the project folder when there is one,
    else at the working directory."""
    if value is None or str(value) == "":
        return default_home()
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    project = project_folder()
    return (project / path) if project is not None else path.absolute()
