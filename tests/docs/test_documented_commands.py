"""Every documented command runs as written.

One test per shell block of README.md and docs/*.md (``tests/docs/blocks.py`` has the
convention): a runnable block runs, as written, in its file's shell session on a temporary
copy of the project against a real ``prefect server`` and real databases
(``tests/docs/session.py``); an illustration block is not run, must say why, and every
``episodic`` command and ``--option`` it shows must exist. A failure names ``file:line``, the
command, its exit code and the block's output.

All of these tests go to one xdist worker (``xdist_group``; ``make test`` runs
``--dist loadgroup``) so each file's blocks run once, in order, in one session.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.databases import PostgresDatabases, require_postgres
from tests.docs.blocks import (
    Block,
    convention_errors,
    documented_files,
    shell_blocks,
    synopsis_errors,
)
from tests.docs.session import FileSession, uses_postgres
from tests.e2e.stack import PrefectServer

pytestmark = [pytest.mark.xdist_group("documented-commands")]

PROJECT = Path(__file__).resolve().parents[2]
BLOCKS = {path: shell_blocks(PROJECT, path) for path in documented_files(PROJECT)}
POSTGRES_FILES = {path for path, blocks in BLOCKS.items() if uses_postgres(blocks)}


def _params(runnable: bool) -> list[object]:
    params = []
    for path, blocks in BLOCKS.items():
        for block in blocks:
            if block.runnable is not runnable:
                continue
            marks = [pytest.mark.slow, pytest.mark.e2e] if runnable else []
            if runnable and path in POSTGRES_FILES:
                marks.append(pytest.mark.postgres)
            params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.fixture(scope="session")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """One real Prefect server for every documented file (its own free port and SQLite)."""
    with PrefectServer(tmp_path_factory.mktemp("docs-prefect"), scheduler_loop_seconds=60) as s:
        yield s


@pytest.fixture(scope="session")
def prefect_db_template(docs_server: PrefectServer) -> Path:
    """The shared server's database right after its migrations: a block's own `prefect
    server start` begins from a copy instead of migrating an empty one (~30 s)."""
    target = docs_server.tmp_dir / "migrated-template.db"
    source = sqlite3.connect(docs_server.database_path)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    return target


@pytest.fixture(scope="session")
def docs_postgres() -> Iterator[list[PostgresDatabases]]:
    holder: list[PostgresDatabases] = []
    yield holder
    for databases in holder:
        databases.close()


@pytest.fixture(scope="session")
def sessions(
    tmp_path_factory: pytest.TempPathFactory,
    docs_server: PrefectServer,
    docs_postgres: list[PostgresDatabases],
    prefect_db_template: Path,
) -> Iterator[dict[str, FileSession]]:
    created: dict[str, FileSession] = {}
    yield created
    for session in created.values():
        for database in session.created_databases():
            docs_postgres[0].drop(database)


def _session(
    path: str,
    sessions: dict[str, FileSession],
    server: PrefectServer,
    tmp_path_factory: pytest.TempPathFactory,
    postgres: list[PostgresDatabases],
    template: Path,
) -> FileSession:
    if path not in sessions:
        make_database = None
        if path in POSTGRES_FILES:
            require_postgres()
            if not postgres:
                postgres.append(PostgresDatabases())
            databases = postgres[0]

            def make_database() -> str:
                return databases.url(databases.fresh(migrated=False))

        work = tmp_path_factory.mktemp("docs-" + path.replace("/", "-").removesuffix(".md"))
        sessions[path] = FileSession(
            path, PROJECT, work, server.api_url, make_database, prefect_db_template=template
        )
    return sessions[path]


@pytest.mark.parametrize("block", _params(runnable=True))
def test_documented_block_runs_as_written(
    block: Block,
    sessions: dict[str, FileSession],
    docs_server: PrefectServer,
    docs_postgres: list[PostgresDatabases],
    tmp_path_factory: pytest.TempPathFactory,
    prefect_db_template: Path,
) -> None:
    session = _session(
        block.path, sessions, docs_server, tmp_path_factory, docs_postgres, prefect_db_template
    )
    result = session.run_through(BLOCKS[block.path], block)
    if not result.ok:
        earlier = session.earlier_failures(block)
        note = f"\n(earlier blocks of {block.path} failed too: {', '.join(earlier)})"
        pytest.fail(result.describe() + (note if earlier else ""), pytrace=False)


@pytest.mark.parametrize("block", _params(runnable=False))
def test_illustration_says_why_and_names_real_commands(block: Block) -> None:
    import typer.main

    from episodic.cli.app import app

    errors = convention_errors(block) + synopsis_errors(block, typer.main.get_command(app))
    assert not errors, "\n".join(errors)
