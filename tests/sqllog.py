"""The SQL log: every statement the tests issue, normalised, per test and backend.

Why: a refactor that promises "the SQL each operation issues does not change" needs a proof
anyone can rerun. Record the log on the tree before the change and on the tree after it, and
compare the two.

Record (inert unless ``EPISODIC_SQL_LOG`` names a directory; it must be empty or new)::

    EPISODIC_SQL_LOG=/tmp/sqllog/after .venv/bin/pytest tests/integration -n 2 -q

On another tree (one without this module), copy ``tests/sqllog.py`` and
``tests/sqllog_site/`` into its ``tests/`` and add ``-p tests.sqllog``.

Compare (exit 0: identical; 1: a statement was added or removed; 2: usage)::

    .venv/bin/python -m tests.sqllog compare BEFORE AFTER --noise BEFORE2

``--noise`` names more recordings of the BEFORE tree: a statement that one BEFORE recording
has for a test and another has not (a race or a retry that issues it only sometimes) is
noise: listed apart, never a diff. Record the base twice for that.

What is recorded, and how:

- every statement SQLAlchemy sends to a cursor: a ``before_cursor_execute`` listener on the
  `Engine` class (all engines, both dialects: the stores, Alembic's migrations, the Postgres
  advisory locks, the test databases' admin engine). Async engines are skipped: they are
  Prefect's own database, not ours;
- the bare-driver path (`BARE_DRIVER_MODULE`, hand-written SQL on the DBAPI cursor, which
  SQLAlchemy's events never see): its executing functions (`BARE_DRIVER_FUNCTIONS`) are
  wrapped at session start, looked up by module name, so a renamed module or function is a
  one-line change here and the trees before and after are recorded the same way;
- statements of the processes the tests start (the CLI, race workers): ``tests/sqllog_site``
  is put first on ``PYTHONPATH`` and its ``sitecustomize`` installs the same recorder in every
  Python child. The child's test is ``PYTEST_CURRENT_TEST``, which it inherits. The
  directory travels in `CHILD_ENV` (the tests' ``clean_environment`` fixture drops every
  ``EPISODIC_*`` variable, which the children would otherwise not see).

A statement belongs to the test running when it was issued; set-up of a fixture wider than
a function (a template database) belongs to ``<fixture NAME>``, so which test of a worker
happens to come first does not move statements between tests.

Normalised (`normalise`): whitespace collapsed; an expanded ``IN (...)`` list and parameter
``VALUES`` rows (any batch size) become one marker; uuids, uuid-hex suffixes of names (test
databases) and temporary paths become markers; a ``CREATE TABLE``'s constraints are sorted
(SQLAlchemy emits them in hash-seed order). Literal state names stay: they are what the
proof is about.

Files: one ``<xdist worker>.json`` per test process (``{test: {backend: [statement]}}``),
one ``child-<pid>.jsonl`` per child process (one line per first sighting).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "EPISODIC_SQL_LOG"
CHILD_ENV = "SQLLOG_CHILD_DIR"
BARE_DRIVER_MODULE = "episodic.storage.dbapi"  # storage.hot on 7b46ebf (its copy there says so)
BARE_DRIVER_FUNCTIONS = ("fetch_one", "fetch_all", "rowcount")
SITE_DIR = Path(__file__).with_name("sqllog_site")
OUTSIDE = "<session>"

Log = dict[str, dict[str, set[str]]]  # test -> backend -> normalised statements

# ---------------------------------------------------------------------------- normalising

_PLACEHOLDER = r"(?:\?|%s|%\(\w+\)s|:\w+|\$\d+)"
_CAST = r"(?:::\w+)?"  # PostgreSQL's expanded IN lists cast each parameter: %(k_1_1)s::VARCHAR
_IN_LIST = re.compile(
    rf"\bIN \(\s*{_PLACEHOLDER}{_CAST}(?:\s*,\s*{_PLACEHOLDER}{_CAST})*\s*\)", re.I
)
_ROW = r"\((?:[^()]|\([^()]*\))*\)"
_VALUES_ROWS = re.compile(rf"\bVALUES\s*{_ROW}(?:\s*,\s*{_ROW})*", re.I)
_HAS_PLACEHOLDER = re.compile(_PLACEHOLDER)
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_HEX_SUFFIX = re.compile(r"(?<=[A-Za-z]_)[0-9a-f]{8,32}(?![0-9A-Za-z])")  # also before `_copy`
_TMP_PATH = re.compile(r"/tmp/[^\s'\"]+")


def _rows(match: re.Match[str]) -> str:
    """Parameter rows (an executemany batch of any size) as one marker; literal rows stay."""
    return "VALUES <rows>" if _HAS_PLACEHOLDER.search(match.group(0)) else match.group(0)


_CREATE_TABLE = re.compile(r"^(CREATE TABLE \S+ \( )(.*)( \))$", re.S)
_TABLE_CONSTRAINT = re.compile(r"^(CONSTRAINT|PRIMARY KEY|FOREIGN KEY|UNIQUE|CHECK)\b")


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(text[start:at].strip())
            start = at + 1
    parts.append(text[start:].strip())
    return parts


def _constraints_sorted(text: str) -> str:
    """A ``CREATE TABLE`` with its table constraints in a stable order: SQLAlchemy emits them
    in a set's order, which moves with the process's hash seed (Alembic's SQLite batch
    migrations showed it). The columns keep their order."""
    match = _CREATE_TABLE.match(text)
    if match is None:
        return text
    elements = _split_top_level(match.group(2))
    columns = [e for e in elements if not _TABLE_CONSTRAINT.match(e)]
    constraints = sorted(e for e in elements if _TABLE_CONSTRAINT.match(e))
    return f"{match.group(1)}{', '.join(columns + constraints)}{match.group(3)}"


def normalise(sql: str) -> str:
    """`sql` with what varies between identical runs replaced by markers (see the module)."""
    text = _constraints_sorted(" ".join(sql.split()))
    text = _IN_LIST.sub("IN (<list>)", text)
    text = _VALUES_ROWS.sub(_rows, text)
    text = _UUID.sub("<uuid>", text)
    text = _HEX_SUFFIX.sub("<hex>", text)
    return _TMP_PATH.sub("<tmp>", text)


# ---------------------------------------------------------------------------- recording


class Recorder:
    """The statements of this process, per test and backend (thread-safe)."""

    def __init__(self, out: Path, *, child: bool) -> None:
        self.out = out
        self.child = child
        self.log: Log = {}
        self.context: str | None = None  # a wide fixture being set up
        self._lock = threading.Lock()
        self._lines: Any = None

    def test(self) -> str:
        if self.context is not None:
            return self.context
        current = os.environ.get("PYTEST_CURRENT_TEST")
        return current.rsplit(" (", 1)[0] if current else OUTSIDE

    def record(self, backend: str, sql: str) -> None:
        test, statement = self.test(), normalise(sql)
        with self._lock:
            seen = self.log.setdefault(test, {}).setdefault(backend, set())
            if statement in seen:
                return
            seen.add(statement)
            if self.child:  # written at once: a child may be killed, never reaching atexit
                if self._lines is None:
                    name = f"child-{os.getpid()}-{time.time_ns()}.jsonl"
                    self._lines = (self.out / name).open("a", buffering=1, encoding="utf-8")
                line = {"test": test, "backend": backend, "sql": statement}
                self._lines.write(json.dumps(line) + "\n")

    def dump(self) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        data = {
            test: {backend: sorted(stmts) for backend, stmts in sorted(by.items())}
            for test, by in sorted(self.log.items())
        }
        (self.out / f"{worker}.json").write_text(json.dumps(data, indent=1) + "\n")


_recorder: Recorder | None = None


def _on_cursor_execute(
    conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    if _recorder is None or conn.dialect.is_async:  # async: Prefect's own database
        return
    _recorder.record(conn.dialect.name, statement)


def _bare_driver_sql(conn: Any, statement: Any) -> str:
    """The text the bare-driver path sends for `statement` (a `storage.dbapi.DriverSQL`)."""
    if conn.dialect.name == "sqlite":
        return str(getattr(statement, "sqlite", statement))
    return str(getattr(statement, "pg", statement))


def _wrap_bare_driver(module: ModuleType) -> None:
    for name in BARE_DRIVER_FUNCTIONS:
        original = getattr(module, name)
        if getattr(original, "_sqllog", False):
            continue

        def wrapper(
            conn: Any, statement: Any, *args: Any, _original: Callable[..., Any] = original
        ) -> Any:
            if _recorder is not None:
                _recorder.record(conn.dialect.name, _bare_driver_sql(conn, statement))
            return _original(conn, statement, *args)

        wrapper._sqllog = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, name, wrapper)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after module `name` is first imported. A child patches
    lazily: importing SQLAlchemy or the product eagerly would load them into every Python
    child (Prefect's server too) and change what it does at start."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        sys.meta_path.remove(self)
        execute, then = loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            execute(module)
            then(module)

        loader.exec_module = exec_module
        return spec


def _after_import(name: str, then: Callable[[ModuleType], None], *, now: bool) -> None:
    if name in sys.modules or now:
        then(importlib.import_module(name))
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _listen(sqlalchemy: ModuleType) -> None:
    from sqlalchemy import Engine, event

    event.listen(Engine, "before_cursor_execute", _on_cursor_execute)


def install(out: Path, *, child: bool) -> None:
    """Start recording this process's statements into `out`."""
    global _recorder
    if _recorder is not None:
        return
    _recorder = Recorder(out, child=child)
    _after_import("sqlalchemy", _listen, now=not child)
    _after_import(BARE_DRIVER_MODULE, _wrap_bare_driver, now=not child)


def stop() -> None:
    """Stop recording here (the pytest process's own recorder takes over)."""
    global _recorder
    _recorder = None
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
    module = sys.modules.get(BARE_DRIVER_MODULE)
    for name in BARE_DRIVER_FUNCTIONS if module is not None else ():
        wrapped = getattr(getattr(module, name), "__wrapped__", None)
        if wrapped is not None:
            setattr(module, name, wrapped)
    if "sqlalchemy" in sys.modules:
        from sqlalchemy import Engine, event

        if event.contains(Engine, "before_cursor_execute", _on_cursor_execute):
            event.remove(Engine, "before_cursor_execute", _on_cursor_execute)


CHILD_MODULE = "_sqllog_child"  # the name ``sqllog_site/sitecustomize.py`` loads this file as


def install_child() -> None:
    """Called by ``sqllog_site/sitecustomize.py`` in every Python child of a recording."""
    out = os.environ.get(CHILD_ENV)
    if out:
        install(Path(out), child=True)


# ---------------------------------------------------------------------------- pytest


def _plugin(out: Path) -> object:
    import pytest  # here: a child process loads this module without pytest

    class Plugin:
        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionstart(self, session: Any) -> None:
            # An xdist worker is a child of the controller: its sitecustomize copy stops.
            child = sys.modules.get(CHILD_MODULE)
            if child is not None:
                child.stop()
            install(out, child=False)

        @pytest.hookimpl(wrapper=True)
        def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
            if _recorder is None or fixturedef.scope == "function":
                return (yield)
            outer, _recorder.context = _recorder.context, f"<fixture {fixturedef.argname}>"
            try:
                return (yield)
            finally:
                _recorder.context = outer

        def pytest_sessionfinish(self, session: Any) -> None:
            if _recorder is not None:
                _recorder.dump()

    return Plugin()


def pytest_configure(config: Any) -> None:
    """Register the recorder when ``EPISODIC_SQL_LOG`` is set (else do nothing)."""
    raw = os.environ.get(ENV) or os.environ.get(CHILD_ENV)
    if not raw or config.pluginmanager.has_plugin("sqllog-recorder"):
        return
    out = Path(raw).absolute()
    out.mkdir(parents=True, exist_ok=True)
    os.environ[CHILD_ENV] = str(out)
    path = os.environ.get("PYTHONPATH")
    if str(SITE_DIR) not in (path or "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *([path] if path else [])])
    config.pluginmanager.register(_plugin(out), "sqllog-recorder")


# ---------------------------------------------------------------------------- comparing


def load(directory: Path) -> Log:
    """A recording: the union of its processes' files, normalised again (so a recording
    made by an older `normalise` compares under this one)."""
    log: Log = {}
    if not directory.is_dir():
        raise SystemExit(f"sqllog: no recording at {directory}")
    for path in sorted(directory.glob("*.json")):
        for test, by in json.loads(path.read_text()).items():
            for backend, stmts in by.items():
                log.setdefault(test, {}).setdefault(backend, set()).update(map(normalise, stmts))
    for path in sorted(directory.glob("child-*.jsonl")):
        for raw in path.read_text().splitlines():
            if raw.strip():
                line = json.loads(raw)
                log.setdefault(line["test"], {}).setdefault(line["backend"], set()).add(
                    normalise(line["sql"])
                )
    return log


def overall(log: Log) -> dict[str, set[str]]:
    union: dict[str, set[str]] = {}
    for by in log.values():
        for backend, stmts in by.items():
            union.setdefault(backend, set()).update(stmts)
    return union


def _noise(logs: Sequence[Log]) -> Log:
    """Per test and backend: the statements not every one of `logs` has."""
    noise: Log = {}
    for test in set().union(*logs):
        backends = set().union(*(log.get(test, {}) for log in logs))
        for backend in backends:
            sets = [log.get(test, {}).get(backend, set()) for log in logs]
            differ = set().union(*sets) - set.intersection(*sets)
            if differ:
                noise.setdefault(test, {})[backend] = differ
    return noise


def compare(before: Path, after: Path, more_before: Sequence[Path] = ()) -> int:
    """Print the differences of `after` from `before`; 0 when identical, else 1."""
    base = load(before)
    bases = [base, *(load(path) for path in more_before)]
    new = load(after)
    noise = _noise(bases)
    all_noise = overall(noise)
    base_all, new_all = overall(base), overall(new)
    for other in bases[1:]:
        for backend, stmts in overall(other).items():
            base_all.setdefault(backend, set()).update(stmts)
    differs = False

    def show(title: str, stmts: set[str]) -> None:
        for sql in sorted(stmts):
            print(f"    {title} {sql}")

    print(f"sqllog: {before} -> {after}")
    for backend in sorted(set(base_all) | set(new_all)):
        b, a = base_all.get(backend, set()), new_all.get(backend, set())
        added, removed = a - b, b - a - all_noise.get(backend, set())
        print(f"  {backend}: {len(b)} statements before, {len(a)} after")
        if added or removed:
            differs = True
            print(f"  {backend} overall: {len(added)} added, {len(removed)} removed")
            show("+", added)
            show("-", removed)
    per_test: list[str] = []
    missing = sorted(set(base) - set(new))
    extra = sorted(set(new) - set(base))
    for test in sorted(set(base) & set(new)):
        for backend in sorted(set(base[test]) | set(new[test])):
            b = set().union(*(log.get(test, {}).get(backend, set()) for log in bases))
            a = new[test].get(backend, set())
            quiet = noise.get(test, {}).get(backend, set())
            added, removed = a - b, b - a - quiet
            if added or removed:
                per_test.append(test)
                print(f"  {test} [{backend}]: {len(added)} added, {len(removed)} removed")
                show("+", added)
                show("-", removed)
    if per_test:
        differs = True
    if missing or extra:
        differs = True
        for test in missing:
            print(f"  test not in AFTER: {test}")
        for test in extra:
            print(f"  test not in BEFORE: {test}")
    if noise:
        count = sum(len(stmts) for stmts in all_noise.values())
        print(f"  noise (differs between the BEFORE recordings; not a diff): {count}")
        for test in sorted(noise):
            for backend, stmts in sorted(noise[test].items()):
                print(f"    {test} [{backend}]:")
                show("~", stmts)
    print("sqllog: differs" if differs else "sqllog: identical")
    return 1 if differs else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sqllog", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cmp = commands.add_parser("compare", help="statements added/removed from BEFORE to AFTER")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument(
        "--noise",
        type=Path,
        action="append",
        default=[],
        help="another recording of the BEFORE tree (repeatable): what differs is noise",
    )
    args = parser.parse_args(argv)
    return compare(args.before, args.after, args.noise)


if __name__ == "__main__":
    sys.exit(main())
