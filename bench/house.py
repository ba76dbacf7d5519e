"""The house report: module sizes, the longest functions and the import graph's cycles.

A report anyone can rerun of how the code is laid out: how long each product module is,
which modules pass 400 and 450 lines, which functions pass 60 lines, and which modules
import each other in a cycle. Read from the source with `ast`, nothing imported or run;
`tests/unit/test_layout.py` checks its rules on the same graph.

Imports count at any depth (a function-level import closes a cycle at run time as surely as
one at the top): ``import a.b`` (an edge to ``a.b``), ``from a.b import name`` (to ``a.b``)
and relative forms. ``from pkg import mod``, `mod` a module, is an edge to ``pkg.mod`` and
one to ``pkg``: the statement reads the package's namespace, so a package whose
``__init__`` imports `mod` while `mod` imports from the package is a cycle (say
``storage/__init__.py`` -> ``episodic.storage.engine`` -> ``storage``). A cycle is reported
once, as a strongly connected component of more than one module.

Run: .venv/bin/python -m bench.house [--json] [--root DIR]

Exit 0 when no module it reads is in an import cycle, 1 when one is: a script can gate on it.
Sizes are a smell to look at, not a limit: a long module or function is reported and never
fails the run. The other house rules (layering, private names, flows beyond the engine
factory) are checked by `tests/unit/test_layout.py` only.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The product's folders in layer order, each a subpackage of the one import package `episodic`
# (the one list: the layout, architecture-doc and project-copy tests read it).
PRODUCT_PACKAGES = (
    "core",
    "storage",
    "providers",
    "pipeline",
    "tasks",
    "flows",
    "deployments",
    "cli",
    "testing",
)
PACKAGES = (*PRODUCT_PACKAGES, "reliability")
LONG_MODULE = 400
VERY_LONG_MODULE = 450
LONG_FUNCTION = 60


@dataclass(frozen=True)
class Import:
    """One imported name: `target` is the module it resolves to; `name` the attribute
    imported from it (None for ``import target``); `alias` what the importer binds."""

    source: str
    target: str
    name: str | None
    alias: str
    line: int
    in_function: bool
    type_only: bool = False  # under ``if TYPE_CHECKING:``: never runs, closes no cycle
    package_read: bool = False  # the package edge of ``from pkg import mod``


@dataclass(frozen=True)
class Function:
    module: str
    qualname: str
    line: int
    lines: int


PRODUCT = frozenset(PRODUCT_PACKAGES)


def module_name(path: Path, root: Path) -> str:
    """The dotted name `path` imports as: ``episodic.storage.runs`` for ``storage/runs.py``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts and parts[0] in PRODUCT:
        parts.insert(0, "episodic")
    return ".".join(parts)


def package_of(module: str) -> str:
    """The folder a module lives in: ``storage`` for ``episodic.storage.runs``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "episodic" and len(parts) > 1 else parts[0]


def product_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """``{dotted module name: path}`` of every module of `packages` under `root`."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path, root)] = path
    return found


@functools.cache
def parse(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once per process (the rules read each module often)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(
    node: ast.AST, in_function: bool = False, type_only: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node below `node`, with whether it is in a function and type-checking only."""
    for child in ast.iter_child_nodes(node):
        yield child, in_function, type_only
        if _is_type_checking(child):
            assert isinstance(child, ast.If)
            for inner in child.body:
                yield inner, in_function, True
                yield from _walk(inner, in_function, True)
            for inner in child.orelse:
                yield inner, in_function, type_only
                yield from _walk(inner, in_function, type_only)
            continue
        function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(child, in_function or function, type_only)


def _from_parent(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` statement imports from, relative forms resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: set[str] | dict[str, Path]) -> list[Import]:
    """Every import of `module` (at any depth), resolved against the `known` modules.

    A target outside `known` (the standard library, a dependency) keeps its dotted name.
    """
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node, in_function, type_only in _walk(parse(path)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue

        def add(target: str, name: str | None, alias: str, *, package_read: bool = False) -> None:
            found.append(
                Import(
                    module,
                    target,
                    name,
                    alias,
                    node.lineno,
                    in_function,
                    type_only,
                    package_read,
                )
            )

        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, None, alias.asname or alias.name.split(".")[0])
            continue
        parent = _from_parent(module, is_package, node)
        for alias in node.names:
            bound = alias.asname or alias.name
            sub = f"{parent}.{alias.name}"
            if sub in known:  # the package is read too: a package-init cycle shows
                add(sub, None, bound)
                add(parent, alias.name, bound, package_read=True)
            else:
                add(parent, alias.name, bound)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: {product module it imports, ...}}`` (function-level imports included)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path, modules):
            if imp.target in modules and imp.target != name and not imp.type_only:
                graph[name].add(imp.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative: no recursion limit on a deep graph
        nonlocal counter
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, for the reader."""
    members = set(component)
    start = component[0]
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    nxt.append(succ)
        frontier = nxt
    return component


def functions_of(module: str, path: Path) -> list[Function]:
    """Every function and method with its length in lines (``def`` to its last line)."""
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(Function(module, qualname, child.lineno, end - child.lineno + 1))
                visit(child, f"{qualname}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(parse(path), "")
    return found


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def report(root: Path = ROOT) -> dict[str, object]:
    """The figures, as `--json` prints them."""
    modules = product_modules(root)
    sizes = {name: line_count(path) for name, path in modules.items()}
    by_package: dict[str, dict[str, int]] = {}
    for name, lines in sizes.items():
        package = by_package.setdefault(package_of(name), {"modules": 0, "lines": 0})
        package["modules"] += 1
        package["lines"] += lines
    long_functions = sorted(
        (f for name, path in modules.items() for f in functions_of(name, path)),
        key=lambda f: (-f.lines, f.module, f.qualname),
    )
    graph = import_graph(modules)
    components = cycles(graph)
    return {
        "packages": by_package,
        "modules_over_400": {
            n: s for n, s in sorted(sizes.items(), key=lambda i: -i[1]) if s > LONG_MODULE
        },
        "modules_over_450": {
            n: s for n, s in sorted(sizes.items(), key=lambda i: -i[1]) if s > VERY_LONG_MODULE
        },
        "functions_over_60": [
            {"function": f"{f.module}:{f.qualname}", "line": f.line, "lines": f.lines}
            for f in long_functions
            if f.lines > LONG_FUNCTION
        ],
        "cycles": [
            {"modules": component, "example": shortest_cycle(graph, component)}
            for component in components
        ],
        "module_sizes": dict(sorted(sizes.items())),
    }


def show(figures: dict[str, object]) -> None:
    packages: dict[str, dict[str, int]] = figures["packages"]  # type: ignore[assignment]
    over_400: dict[str, int] = figures["modules_over_400"]  # type: ignore[assignment]
    over_450: dict[str, int] = figures["modules_over_450"]  # type: ignore[assignment]
    long_functions: list[dict[str, object]] = figures["functions_over_60"]  # type: ignore[assignment]
    found: list[dict[str, list[str]]] = figures["cycles"]  # type: ignore[assignment]
    print("package       modules   lines")
    for package in PACKAGES:
        figure = packages.get(package, {"modules": 0, "lines": 0})
        print(f"{package:<12} {figure['modules']:>8} {figure['lines']:>7}")
    print(
        f"\nmodules over {LONG_MODULE} lines: {len(over_400)} "
        f"(over {VERY_LONG_MODULE}: {len(over_450)})"
    )
    for name, lines in over_400.items():
        print(f"  {lines:>5}  {name}{'  (> 450)' if name in over_450 else ''}")
    print(f"\nfunctions over {LONG_FUNCTION} lines: {len(long_functions)}")
    for f in long_functions:
        print(f"  {f['lines']:>5}  {f['function']} (line {f['line']})")
    print(f"\nimport cycles (function-level imports included): {len(found)}")
    for cycle in found:
        print(f"  {len(cycle['modules'])} modules: {', '.join(cycle['modules'])}")
        print(f"      e.g. {' -> '.join(cycle['example'])}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read")
    args = parser.parse_args()
    figures = report(args.root.resolve())
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        print()
    else:
        show(figures)
    if figures["cycles"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
