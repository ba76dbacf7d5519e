"""docs/architecture.md names every product module, and no module that does not exist.

Under "## The rooms" each layer has a line in bold (``**storage**``) followed by a table whose
first column names its modules relative to the layer's folder (```locks.py```, several in one
cell separated by commas); a name ending in ``/`` (```migrations/```) stands for every module
under that folder. The package's own ``__init__.py`` and ``__main__.py`` are the table of
``**episodic**``. A layer's ``__init__.py`` is a module of its own only when it holds
something (a docstring or code): an empty one only marks the package. Anywhere on the page,
a path such as ```storage/locks.py``` names a module that must exist.

A module added, renamed or removed without its line fails here, with the list to mend.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.house import PRODUCT_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
LAYERS = PRODUCT_PACKAGES
PACKAGE = "episodic"

_LAYER_LINE = re.compile(r"^\*\*(\w+)\*\*")
_NAME = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"`((?:" + "|".join((*LAYERS, PACKAGE)) + r")/[\w/]+\.py)`")


def product_modules() -> set[str]:
    """Every product module as a path from the repository's root (``storage/locks.py``)."""
    found: set[str] = set()
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            if path.name == "__init__.py" and not path.read_text().strip():
                continue
            found.add(path.relative_to(ROOT).as_posix())
    found.update(f"{PACKAGE}/{name}" for name in ("__init__.py", "__main__.py"))
    return found


def _rooms(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("## The rooms")
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def documented_entries(text: str) -> set[str]:
    """The first-column names of each layer's table under "## The rooms", as paths from the
    repository's root (a folder keeps its trailing ``/``)."""
    entries: set[str] = set()
    layer: str | None = None
    for line in _rooms(text):
        if match := _LAYER_LINE.match(line):
            layer = match.group(1) if match.group(1) in (*LAYERS, PACKAGE) else None
        elif layer and line.startswith("|"):
            first = line.split("|")[1]
            entries.update(f"{layer}/{name}" for name in _NAME.findall(first))
    return entries


def _covers(entry: str, module: str) -> bool:
    return module.startswith(entry) if entry.endswith("/") else module == entry


def test_every_product_module_has_its_line_in_the_architecture_page() -> None:
    entries = documented_entries(DOC.read_text())
    missing = sorted(m for m in product_modules() if not any(_covers(e, m) for e in entries))
    assert not missing, f"modules without a line in docs/architecture.md: {missing}"


def test_every_module_the_architecture_page_names_exists() -> None:
    text = DOC.read_text()
    modules = product_modules()
    entries = documented_entries(text)
    gone = sorted(e for e in entries if not any(_covers(e, m) for m in modules))
    gone += sorted(
        path for path in set(_PATH.findall(text)) - entries if not (ROOT / path).is_file()
    )
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def test_the_tables_are_read_as_documented() -> None:
    """The reader itself, on a page of two layers: a cell of several names, a folder, a
    line outside any table, and a layer that is not a product layer."""
    page = "\n".join(
        [
            "## The rooms",
            "**storage** (the database)",
            "| module | concept |",
            "|---|---|",
            "| `locks.py` | the lock protocol |",
            "| `engine.py`, `registry.py` | engines |",
            "| `migrations/` | Alembic |",
            "**reliability**: the fault suite; `harness.py` runs real processes",
            "| `oracle.py` | not a product module |",
            "**episodic** (the package)",
            "| `__init__.py`, `__main__.py` | the package |",
            "## The lock order",
            "| `after.py` | not in the rooms |",
        ]
    )
    assert documented_entries(page) == {
        "storage/locks.py",
        "storage/engine.py",
        "storage/registry.py",
        "storage/migrations/",
        "episodic/__init__.py",
        "episodic/__main__.py",
    }
    assert _covers("storage/migrations/", "storage/migrations/versions/0001_episodes.py")
    assert not _covers("storage/media.py", "storage/media_backends.py")
