"""The state folder: where it is, what its ledger holds, and removing it only when told twice.

The state folder (``EPISODIC_HOME``, by default the project's ``.episodic``: `core.home`) holds
the embedded SQLite ledger, every paid image, ``providers.yaml``, Prefect's home and the item
results. Removing it forgets what was bought: a later run pays again. So `remove_state`:

- refuses (`InvalidInput`, exit 2) a server database (PostgreSQL): it never drops a shared
  database, and never removes the local folder either, since that folder holds the images
  the shared ledger records as paid;
- refuses a SQLite ledger outside the state folder (``EPISODIC_DATABASE_URL`` pointing
  elsewhere), and a folder that holds the project, the user's home or is a filesystem root;
- removes only a state folder: one that holds the ledger ``episodic.db`` or the marker
  (`episodic.core.home.STATE_MARKER`) the project writes when it creates the folder, and nothing at
  its top level that the project does not create there (`STATE_ENTRIES`): a user's folder
  that ``EPISODIC_HOME`` names by mistake, or a folder of the project's own code
  (``EPISODIC_HOME=core``), is refused naming one of its files;
- refuses without ``yes``; and while the ledger records any paid call, refuses unless also
  ``including_paid``, saying how many paid calls and how much money it holds.

Reading the ledger never creates or migrates it (a read-only connection, only when its file
exists).
"""

from __future__ import annotations

import fnmatch
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from episodic.core.errors import InvalidInput
from episodic.core.home import STATE_MARKER, project_folder
from episodic.core.money import format_money
from episodic.core.settings import Settings

# What the project creates at the top of a state folder (glob patterns): the ledger and its
# SQLite companions and lock files, the default media store, Prefect's home, the item
# results, the episodes' files, the provider profiles, the fake provider's jobs, the marker,
# and what `episodic demo` leaves: the local copies of its episodes and its server's log.
STATE_ENTRIES = (
    "episodic.db",
    "episodic.db-*",
    "episodic.db.*",
    "media",
    "prefect",
    "results",
    "episodes",
    "providers.yaml",
    "fake-provider",
    STATE_MARKER,
    "demo",
    "prefect-server.log",
)


@dataclass(frozen=True)
class StateFolder:
    """What `inspect_state` found. ``sqlite_file`` is None for a server database;
    ``spent`` is minor units per currency."""

    home: Path
    project: Path | None
    database: str  # where the ledger is, as messages name it (no password)
    sqlite_file: Path | None
    exists: bool
    paid_calls: int = 0
    spent: dict[str, int] = field(default_factory=dict)

    def holdings(self) -> str:
        """``14 paid calls (3.50 USD)``: what the ledger holds, in words."""
        money = ", ".join(
            format_money(amount, currency) for currency, amount in sorted(self.spent.items())
        )
        calls = f"{self.paid_calls} paid call{'' if self.paid_calls == 1 else 's'}"
        return f"{calls} ({money})" if money else calls

    def to_dict(self) -> dict[str, Any]:
        return {
            "home": str(self.home),
            "project": str(self.project) if self.project is not None else None,
            "database": self.database,
            "embedded": self.sqlite_file is not None,
            "exists": self.exists,
            "paid_calls": self.paid_calls,
            "spent_micros": dict(self.spent),
        }


def inspect_state(settings: Settings) -> StateFolder:
    """Where the state lives and what its ledger holds. A server database's holdings are
    not read (0): it is never removed here. Raises `InvalidInput` for a bad URL."""
    from episodic.storage.engine import database_label, make_engine, normalize_url, sqlite_path

    url = normalize_url(settings.url)
    home = settings.home_path
    folder = StateFolder(
        home=home,
        project=project_folder(),
        database=database_label(url),
        sqlite_file=sqlite_path(url) if url.get_backend_name() == "sqlite" else None,
        exists=home.is_dir(),
    )
    if folder.sqlite_file is None or not folder.sqlite_file.is_file():
        return folder
    from episodic.storage.ledger import ledger_totals

    engine = make_engine(url, read_only=True)
    try:
        calls, spent = ledger_totals(engine)
    finally:
        engine.dispose()
    return StateFolder(**{**folder.__dict__, "paid_calls": calls, "spent": spent})


def remove_state(settings: Settings, *, yes: bool, including_paid: bool) -> StateFolder:
    """Remove the state folder (see the module's rules); returns what was removed, with
    ``exists`` False when there was nothing to remove. Raises `InvalidInput` (exit 2) for
    every refusal, before anything is removed."""
    folder = inspect_state(settings)
    home = folder.home
    if folder.sqlite_file is None:
        raise InvalidInput(
            f"the ledger is the server database {folder.database}: `episodic state remove` "
            f"never drops a server database, nor removes {home}, whose images it records as "
            "paid"
        )
    if not folder.sqlite_file.is_relative_to(home):
        raise InvalidInput(
            f"EPISODIC_DATABASE_URL names the SQLite ledger {folder.sqlite_file}, outside the "
            f"state folder {home}: nothing removed (remove what you mean to yourself)"
        )
    _refuse_unsafe(home, folder.project)
    if not folder.exists:
        return folder
    _refuse_not_state(home)
    if folder.paid_calls and not (yes and including_paid):
        raise InvalidInput(
            f"the ledger {folder.database} holds {folder.holdings()}: removing {home} forgets "
            "what was paid for (a later run pays again); pass both --yes and --including-paid "
            "to remove it anyway"
        )
    if not yes:
        raise InvalidInput(f"this removes {home} (its ledger holds no paid call): pass --yes")
    shutil.rmtree(home)
    return folder


def _refuse_unsafe(home: Path, project: Path | None) -> None:
    """Never a folder that holds the project's code, the user's home, or a root."""
    resolved = home.resolve()
    guarded = [Path.home().resolve()] + ([project.resolve()] if project is not None else [])
    if resolved == Path(resolved.anchor) or any(g.is_relative_to(resolved) for g in guarded):
        raise InvalidInput(
            f"the state folder {home} holds the project folder or your home folder (or is a "
            "root): nothing removed; set EPISODIC_HOME to the state folder itself"
        )


def _refuse_not_state(home: Path) -> None:
    """Only a folder the project made (its marker) or an older one holding its ledger, and
    holding nothing at its top level the project did not create."""
    if home.is_symlink():
        raise InvalidInput(f"the state folder {home} is a symbolic link: nothing removed")
    names = sorted(entry.name for entry in home.iterdir())
    if STATE_MARKER not in names and "episodic.db" not in names:
        raise InvalidInput(
            f"{home} is not a state folder (no episodic.db, no {STATE_MARKER}): nothing "
            "removed; set EPISODIC_HOME to the state folder itself"
        )
    foreign = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in STATE_ENTRIES)]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise InvalidInput(
            f"{home} holds {foreign[0]!r}{more}, which episodic does not create in a state "
            "folder: nothing removed (move it elsewhere first)"
        )
