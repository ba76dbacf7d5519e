"""The package layout's rules, read from the source (every import statement, at any depth).

Dependencies point one way: `core` <- `storage`, `providers` <- `pipeline` <- `tasks` <-
`flows` <- `deployments`, with `cli` on top. `core`, `storage`, `providers` and `pipeline`
never import Prefect (or the Dask runner), so they stay usable and fast without an
orchestrator. Property tests never touch the global `random` module: hypothesis draws
their inputs, and pyproject.toml silences hypothesis's check of the global random state
only because other threads of the process move it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = {
    "core": 0,
    "storage": 1,
    "providers": 1,
    "pipeline": 2,
    "tasks": 3,
    "flows": 4,
    "deployments": 5,
    "cli": 6,
}
ORCHESTRATOR = {"prefect", "prefect_dask", "dask", "distributed"}


def imported_packages(package: str) -> dict[str, set[str]]:
    """Top-level names each module of `package` imports: ``{module path: {name, ...}}``."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", sorted(RANK))
def test_no_package_reaches_up_or_sideways(package: str) -> None:
    rank = RANK[package]
    wrong = {
        module: sorted(n for n in names if n in RANK and n != package and RANK[n] >= rank)
        for module, names in imported_packages(package).items()
    }
    assert {m: n for m, n in wrong.items() if n} == {}


@pytest.mark.parametrize("package", ["core", "storage", "providers", "pipeline"])
def test_the_domain_layers_never_import_the_orchestrator(package: str) -> None:
    wrong = {m: sorted(n & ORCHESTRATOR) for m, n in imported_packages(package).items()}
    assert {m: n for m, n in wrong.items() if n} == {}


def test_property_tests_never_use_the_global_random_module() -> None:
    users = [m for m, names in imported_packages("tests/property").items() if "random" in names]
    assert users == []


def test_the_rules_see_a_violation() -> None:
    """The reader is not vacuous: it finds this module's own imports."""
    mine = imported_packages("tests/unit")["tests/unit/test_layout.py"]
    assert {"ast", "pytest", "pathlib"} <= mine
