"""Where this installation keeps its state: the project's state folder, whatever the working
directory a command starts in.

The state folder (``EPISODIC_HOME``) holds the SQLite ledger, the pipeline's lock files, the
paid images, ``providers.yaml``, Prefect's home and the item results. Following the working
directory would let a command started elsewhere (a cron job runs from ``$HOME``) create an
empty ledger there and pay again for what is already paid, so the default is anchored to the
*project*: the folder this installation's code lives in.

- The project folder is ``EPISODIC_PROJECT_DIR`` when set (a worker whose clone is mounted
  somewhere, or a team's own repository whose ``prefect.yaml`` deploys episodic's flows, as
  `episodic init` writes it; the same variable the deployments' pull step reads), else the
  checkout holding
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

- ``EPISODIC_PROJECT_DIR`` must name an existing project folder by an absolute path: a
  relative one would follow the shell again, and a folder that is not a project holds no
  state of this one. Anything else is refused (`InvalidInput`, exit 2, one line), as are
  blank values and control characters in either variable.

Only `mark_state_folder` creates anything (the state folder, with its marker file, when the
project makes it); `episodic.core.settings` validates the rest.
"""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from pathlib import Path

from episodic.core.errors import InvalidInput

STATE_FOLDER = ".episodic"
# Written into a state folder when this project creates it: what `episodic state remove`
# recognises (with, for folders from before the marker, the ledger ``episodic.db``).
STATE_MARKER = ".episodic-state"
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


def has_control_character(value: str) -> bool:
    """True when `value` holds a control character (a newline, an escape, NUL...)."""
    return any(unicodedata.category(char) == "Cc" for char in value)


def checked_text(variable: str, value: str) -> str:
    """`value` of the environment variable `variable` unless it is blank or holds a control
    character (refused, `InvalidInput`, without echoing it)."""
    if has_control_character(value):
        raise InvalidInput(f"{variable}: the value contains a control character")
    if not value.strip():
        raise InvalidInput(f"{variable}: the value is blank (unset it for the default)")
    return value


def project_folder() -> Path | None:
    """``EPISODIC_PROJECT_DIR`` when set (an absolute path to an existing project folder,
    else `InvalidInput`), else the checkout of this installation's code
    (`installed_project`), else None (a non-editable install)."""
    configured = os.environ.get("EPISODIC_PROJECT_DIR")
    if not configured:
        return installed_project(__file__)
    checked_text("EPISODIC_PROJECT_DIR", configured)
    path = Path(configured).expanduser()
    if not path.is_absolute():
        raise InvalidInput(
            f"EPISODIC_PROJECT_DIR: {configured!r} is relative; give the project folder's "
            "absolute path (a relative one would follow the working directory)"
        )
    try:
        problem = project_folder_problem(path) if path.is_dir() else "it is not a folder"
    except OSError as exc:  # a name too long for the file system, a loop of symlinks, ...
        raise InvalidInput(
            f"EPISODIC_PROJECT_DIR: {str(path)[:200]!r} cannot be read ({exc.strerror})"
        ) from None
    if problem is not None:
        advice = (  # init keeps a prefect.yaml that is there: it must be mended by hand
            "mend it"
            if problem.startswith("its prefect.yaml") and "does not exist" not in problem
            else "unset EPISODIC_PROJECT_DIR and run `episodic init` in that folder"
        )
        raise InvalidInput(
            f"EPISODIC_PROJECT_DIR: {path} is not an episodic project folder (neither a checkout "
            f"of episodic nor a repository whose prefect.yaml has the pull step {PULL_STEP}; "
            f"{problem}): {advice}"
        )
    return path


# The pull step every prefect.yaml of episodic's deployments has: a team repository's (the one
# `episodic init` writes) and the checkout's.
PULL_STEP = "episodic.deployments.steps.project_directory"


def is_project_folder(path: Path) -> bool:
    """Whether `path` is a project folder: a checkout of episodic (`installed_project`), or
    a team's repository whose ``prefect.yaml`` deploys episodic's flows (it names
    `PULL_STEP`, which moves each flow run into that repository on a worker)."""
    return project_folder_problem(path) is None


def project_folder_problem(path: Path) -> str | None:
    """Why `path` is not a project folder (`is_project_folder`), as a phrase such as
    ``its prefect.yaml is not UTF-8 text (byte 3)``; None when it is one."""
    if installed_project(path / "core" / "home.py") is not None:
        return None
    from episodic.core.documents import DocumentError, parse_yaml, read_text

    try:  # a regular file of at most 1 MB: a FIFO there never blocks a command
        document = parse_yaml(read_text(path / "prefect.yaml", max_bytes=1_000_000))
    except DocumentError as exc:  # unreadable, too large, or not YAML Prefect could deploy
        return f"its prefect.yaml {exc}"
    pull = document.get("pull") if isinstance(document, dict) else None
    steps = pull if isinstance(pull, list) else []
    # the step as Prefect runs it: its name with a mapping of inputs (`{}`)
    if any(isinstance(step, dict) and isinstance(step.get(PULL_STEP), dict) for step in steps):
        return None
    return f"its prefect.yaml has no pull step `{PULL_STEP}: {{}}`"


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
    return anchored(Path(checked_text("EPISODIC_HOME", str(value))))


def anchored(path: Path) -> Path:
    """`path` made absolute as a relative ``EPISODIC_HOME`` is: ``~`` expanded, anchored at
    the project folder when there is one, else at the working directory."""
    path = path.expanduser()
    if path.is_absolute():
        return path
    project = project_folder()
    return (project / path) if project is not None else path.absolute()


def mark_state_folder(home: Path) -> None:
    """Create the state folder `home` with its marker file (`STATE_MARKER`) when it does not
    exist yet; an existing folder is left as it is (it may be anyone's). Errors are left to
    the caller that then writes into it."""
    if home.exists():
        return
    try:
        home.mkdir(parents=True)
    except FileExistsError:  # another process made it first; it writes the marker
        return
    except OSError:
        return
    (home / STATE_MARKER).write_text(
        "This folder is episodic's state folder (`episodic state show`).\n", encoding="utf-8"
    )
