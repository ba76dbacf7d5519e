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
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import house

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
    "testing": 7,
}
ORCHESTRATOR = {"prefect", "prefect_dask", "dask", "distributed"}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Absolute module names each module of `package` imports: ``{module path: {name}}``."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def imported_packages(package: str) -> dict[str, set[str]]:
    """Packages each module of `package` imports: ``{module path: {name, ...}}``."""
    return {
        module: {house.package_of(name) for name in names}
        for module, names in imported_modules(package).items()
    }


@pytest.mark.parametrize("package", [*sorted(RANK), "bench", "reliability", "tests"])
def test_product_code_imports_episodic_only(package: str) -> None:
    """Every import of a product module names it in the one import package (``episodic.core``,
    never ``core``): the wheel installs nothing else, and a team's own ``flows`` package would
    shadow a bare ``flows``."""
    bare = {
        module: sorted(n for n in names if n.split(".")[0] in RANK)
        for module, names in imported_modules(package).items()
    }
    assert {m: n for m, n in bare.items() if n} == {}


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


# ---------------------------------------------------------------------------- the house
#
# The rules below read the module graph of bench/house.py (function-level imports count).
# Each rule holds with no exception; `test_the_house_rules_see_a_violation` proves each
# reader finds its violation in a small tree.

ENGINE_FACTORY = "episodic.storage.registry"  # what flows may use of storage: the engine per URL


def _graph_imports(root: Path = ROOT) -> list[house.Import]:
    modules = house.product_modules(root)
    return [
        imp
        for name, path in modules.items()
        for imp in house.imports_of(name, path, modules)
        if not imp.package_read
    ]


def cyclic_modules(root: Path = ROOT) -> set[str]:
    """Modules in an import cycle (a strongly connected component of more than one)."""
    graph = house.import_graph(house.product_modules(root))
    return {module for component in house.cycles(graph) for module in component}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def flows_reaching_into_storage(root: Path = ROOT) -> set[tuple[str, str]]:
    """``(flows module, storage module)`` for every storage import but the engine factory."""
    return {
        (imp.source, imp.target)
        for imp in _graph_imports(root)
        if _in(imp.source, "episodic.flows")
        and _in(imp.target, "episodic.storage")
        and imp.target != ENGINE_FACTORY
    }


def pipeline_using_the_database(root: Path = ROOT) -> set[tuple[str, str]]:
    """``(pipeline module, storage.models | sqlalchemy)`` for each such import. The pipeline
    hands the stores their handle, SQLAlchemy's `Engine`, by its own name (``from sqlalchemy
    import Engine``); it builds no SQL and reads no rows, so nothing else of SQLAlchemy's is
    imported there, and no ORM row."""
    found: set[tuple[str, str]] = set()
    for imp in _graph_imports(root):
        if _in(imp.source, "episodic.pipeline") and _in(imp.target, "episodic.storage.models"):
            found.add((imp.source, "episodic.storage.models"))
    for path in sorted((root / "pipeline").rglob("*.py")):
        module = ".".join(("episodic", *path.relative_to(root).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                beyond = any(_in(alias.name, "sqlalchemy") for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                beyond = _in(node.module, "sqlalchemy") and (
                    node.module != "sqlalchemy" or any(a.name != "Engine" for a in node.names)
                )
            else:
                continue
            if beyond:
                found.add((module, "sqlalchemy"))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path = ROOT) -> set[tuple[str, str]]:
    """``(module, other.module._name)``: a private name of another product module, imported
    (``from m import _x``, a private module) or reached through an imported module
    (``m._x``)."""
    modules = house.product_modules(root)
    found: set[tuple[str, str]] = set()
    for name, path in modules.items():
        bound: dict[str, str] = {}
        dotted: set[str] = set()  # modules imported by their full name (``import a.b``)
        for imp in house.imports_of(name, path, modules):
            if imp.package_read or imp.target not in modules or imp.target == name:
                continue
            if imp.name is not None and _private(imp.name):
                found.add((name, f"{imp.target}.{imp.name}"))
            elif _private(imp.target.rsplit(".", 1)[-1]) and not _in(
                name, imp.target.rsplit(".", 1)[0]
            ):  # a private module, from outside its package
                found.add((name, imp.target))
            if imp.name is None:
                top = imp.target.split(".")[0]
                bound[imp.alias] = imp.target if imp.alias != top else top
                if imp.alias == top:
                    dotted.add(imp.target)
        bound = {alias: target for alias, target in bound.items() if target in modules}
        for node in ast.walk(house.parse(path)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and _private(node.attr)
            ):
                found.add((name, f"{bound[node.value.id]}.{node.attr}"))
            elif (
                isinstance(node, ast.Attribute)
                and (chain := _dotted_name(node.value)) in dotted
                and _private(node.attr)
            ):  # ``a.b._x`` after ``import a.b``
                found.add((name, f"{chain}.{node.attr}"))
    return found


def _dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not parts:
        return None
    return ".".join([node.id, *reversed(parts)])


HOUSE_RULES: dict[str, Callable[[], set[str] | set[tuple[str, str]]]] = {
    "import cycle": cyclic_modules,
    "flows beyond the engine factory": flows_reaching_into_storage,
    "pipeline on storage.models or sqlalchemy": pipeline_using_the_database,
    "another module's private name": private_imports,
}


@pytest.mark.parametrize("rule", sorted(HOUSE_RULES))
def test_no_violation_of_the_house_rules(rule: str) -> None:
    assert sorted(HOUSE_RULES[rule]()) == []


def test_the_house_rules_see_a_violation(tmp_path: Path) -> None:
    """Each reader finds its violation in a small tree: a function-level import cycle
    through a package ``__init__``, flows using a store, pipeline using SQLAlchemy, a
    private name imported and one reached through a module (by an alias or its full dotted
    name)."""
    files = {
        "storage/__init__.py": "from episodic.storage.engine import make\n",
        "storage/engine.py": "def make():\n    from episodic.storage import tx\n",
        "storage/tx.py": "",
        "storage/registry.py": "def engine_for(): ...\n",
        "storage/runs.py": "def _hidden(): ...\n",
        "flows/review.py": (
            "from episodic.storage.registry import engine_for\nfrom episodic.storage import runs\n"
        ),
        "pipeline/check.py": "import sqlalchemy.orm\nfrom episodic.storage.runs import _hidden\n",
        "pipeline/runner.py": "from sqlalchemy import Engine\n",
        "pipeline/report.py": "from sqlalchemy import Engine, select\n",
        "pipeline/legacy.py": "from ..storage import runs\nruns._hidden()\n",
        "pipeline/gate.py": "import episodic.storage.runs\nepisodic.storage.runs._hidden()\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cyclic_modules(tmp_path) == {"episodic.storage", "episodic.storage.engine"}
    assert flows_reaching_into_storage(tmp_path) == {
        ("episodic.flows.review", "episodic.storage.runs")
    }
    assert pipeline_using_the_database(tmp_path) == {
        ("episodic.pipeline.check", "sqlalchemy"),
        ("episodic.pipeline.report", "sqlalchemy"),
    }
    assert private_imports(tmp_path) == {
        ("episodic.pipeline.check", "episodic.storage.runs._hidden"),
        ("episodic.pipeline.legacy", "episodic.storage.runs._hidden"),
        ("episodic.pipeline.gate", "episodic.storage.runs._hidden"),
    }


def _house_report(root: Path) -> tuple[int, dict[str, object]]:
    """`python -m bench.house --json --root root`, run as a script: its exit code and figures."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.house", "--json", "--root", str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_the_house_report_reports_a_long_module_and_fails_only_on_a_cycle(
    tmp_path: Path,
) -> None:
    """A long module is a figure to look at, not a failure; an import cycle fails the run."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli/app.py").write_text("x = 1\n" * (house.VERY_LONG_MODULE + 1))
    code, figures = _house_report(tmp_path)
    assert code == 0
    assert figures["modules_over_450"] == {"episodic.cli.app": house.VERY_LONG_MODULE + 1}
    assert figures["cycles"] == []

    (tmp_path / "cli/a.py").write_text("from episodic.cli import b\n")
    (tmp_path / "cli/b.py").write_text("def f():\n    from episodic.cli import a\n")
    code, figures = _house_report(tmp_path)
    assert code == 1
    assert figures["cycles"] == [
        {
            "modules": ["episodic.cli.a", "episodic.cli.b"],
            "example": ["episodic.cli.a", "episodic.cli.b", "episodic.cli.a"],
        }
    ]
