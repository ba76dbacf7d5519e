"""Shared fixtures: a clean environment, and the same database fixture for every backend."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Before anything imports Prefect: a throwaway Prefect home, no telemetry.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="episodic-tests-"))
os.environ["PREFECT_HOME"] = str(_SESSION_HOME / "prefect")
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(_SESSION_HOME / "results")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ["DO_NOT_TRACK"] = "1"
# This suite's PostgreSQL server, for its own databases and the plugin's `episodic_postgres`
# alike (`episodic.testing.postgres`): the local one unless the environment names another.
os.environ.setdefault(
    "EPISODIC_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

import pytest  # noqa: E402
from sqlalchemy import Engine  # noqa: E402

from episodic.storage.engine import make_engine  # noqa: E402
from episodic.storage.registry import dispose_all  # noqa: E402
from tests import sqllog  # noqa: E402
from tests.databases import PostgresDatabases, SqliteDatabases, require_postgres  # noqa: E402
from tests.fast_loop import no_servers_in_the_fast_loop  # noqa: E402
from tests.media_targets import media  # noqa: E402, F401 (a fixture: the media store on both backends)
from tests.s3_server import S3Server, running_s3_server  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    sqllog.pytest_configure(config)  # the SQL log, inert unless EPISODIC_SQL_LOG is set


# Folders whose every test runs a Prefect harness or server (and the browser checks).
_SERVER_FOLDERS = ("flows", "e2e", "docs", "ui")
_SERVER_FIXTURES = {"s3_server", "postgres_databases", "episodic_postgres", "episodic_prefect"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `servers` every test that starts one: a PostgreSQL database, the moto S3 server
    (the ``s3`` media kind included), a Prefect harness or server. `make test-fast` leaves
    them out, and `tests.fast_loop` fails a test this misses."""
    servers = pytest.mark.servers
    for item in items:
        folder = Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]
        params = getattr(item, "callspec", None)
        values = set() if params is None else {str(v) for v in params.params.values()}
        if (
            folder in _SERVER_FOLDERS
            or item.get_closest_marker("postgres") is not None
            or _SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
            or values & {"s3", "postgres"}
        ):
            item.add_marker(servers)


# The project's own state folder (what every command uses without EPISODIC_HOME: core.home)
# holds a developer's real ledger: tests never write there. Checked over the whole session.
_PROJECT_STATE = Path(__file__).resolve().parents[1] / ".episodic"


def _state_fingerprint() -> list[tuple[str, int, int]]:
    if not _PROJECT_STATE.is_dir():
        return []
    entries = [_PROJECT_STATE, *_PROJECT_STATE.iterdir()]
    return sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in entries if p.exists())


_STATE_BEFORE = _state_fingerprint()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _state_fingerprint() != _STATE_BEFORE:
        session.config.get_terminal_writer().line(
            f"error: the tests wrote into the project's state folder {_PROJECT_STATE}: a test "
            "ran a command without EPISODIC_HOME (tests/conftest.py clean_environment)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No EPISODIC_* variable from a developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("EPISODIC_") and name != "EPISODIC_TEST_DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "home"))
    yield
    dispose_all()


@pytest.fixture(scope="session")
def sqlite_databases(tmp_path_factory: pytest.TempPathFactory) -> SqliteDatabases:
    return SqliteDatabases(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases]:
    no_servers_in_the_fast_loop("a PostgreSQL database")
    require_postgres()
    databases = PostgresDatabases()
    yield databases
    databases.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh, migrated database of the requested backend; EPISODIC_DATABASE_URL points at it."""
    if backend == "sqlite":
        url = request.getfixturevalue("sqlite_databases").fresh(tmp_path / "home")
        monkeypatch.setenv("EPISODIC_DATABASE_URL", url)
        yield url
        return
    databases: PostgresDatabases = request.getfixturevalue("postgres_databases")
    name = databases.fresh()
    url = databases.url(name)
    monkeypatch.setenv("EPISODIC_DATABASE_URL", url)
    yield url
    dispose_all()
    databases.drop(name)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3-compatible server (moto, its own process, loopback only)."""
    with running_s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server
