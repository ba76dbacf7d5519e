"""The `episodic` pytest plugin: fixtures for testing a team's own pipeline.

Registered by the ``pytest11`` entry point of the episodic distribution, so installing
episodic is enough. It defines fixtures only, each named ``episodic_…`` (no autouse fixture,
no hook that changes collection or reporting): a test that asks for none runs as without it.
Importing this module imports neither Prefect nor a database driver; each fixture imports
what it needs when a test asks for it.

- ``episodic_sandbox`` (`episodic.testing.sandbox.Sandbox`): a state folder of the test's own
  under its ``tmp_path``: the embedded SQLite database, the media store, the fake provider's
  jobs and log. Its ``plan(...)`` gives a `Week` that generates, approves and assembles
  through the command line in-process.
- ``episodic_fake`` (`episodic.testing.fake_jobs.FakeJobs`): the sandbox's fake provider,
  read from its own log: jobs per item, calls, what it billed.
- ``episodic_postgres``: the sandbox on a fresh PostgreSQL database (a copy of a migrated
  template made once per session) on the server ``EPISODIC_TEST_DATABASE_URL`` names (an
  admin URL: a role that may create databases); dropped after the test. Without that
  variable, or when the server does not answer, the test is skipped with the reason, and
  fails instead under ``CI=true``. Its value is the database's URL.
- ``episodic_prefect``: Prefect's own test harness (``prefect_test_harness``: a temporary
  database and an ephemeral API), once per session, for a test that runs a team's flow
  calling episodic's tasks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from episodic.testing.fake_jobs import FakeJobs
    from episodic.testing.postgres import PostgresDatabases
    from episodic.testing.sandbox import Sandbox


@pytest.fixture
def episodic_sandbox(tmp_path: Path) -> Sandbox:
    """A state folder of this test's own (``tmp_path / "episodic"``)."""
    from episodic.testing.sandbox import Sandbox

    return Sandbox(tmp_path / "episodic")


@pytest.fixture
def episodic_fake(episodic_sandbox: Sandbox) -> FakeJobs:
    """The sandbox's fake provider, read from its own log."""
    return episodic_sandbox.fake


@pytest.fixture(scope="session")
def _episodic_postgres_databases() -> Iterator[PostgresDatabases]:
    from episodic.testing.postgres import (
        SERVER_VARIABLE,
        PostgresDatabases,
        under_ci,
        unreachable,
    )

    url = os.environ.get(SERVER_VARIABLE, "").strip()
    reason = (
        f"no PostgreSQL server named: set {SERVER_VARIABLE} to an admin URL"
        if not url
        else unreachable(url)
    )
    if reason is not None:
        if under_ci():
            pytest.fail(f"{reason} (under CI=true a PostgreSQL test must run)")
        pytest.skip(reason)
    databases = PostgresDatabases(url, prefix="episodic_plugin")
    yield databases
    databases.close()


@pytest.fixture
def episodic_postgres(
    episodic_sandbox: Sandbox, _episodic_postgres_databases: PostgresDatabases
) -> Iterator[str]:
    """The sandbox on a fresh migrated PostgreSQL database; its URL."""
    databases = _episodic_postgres_databases
    name = databases.fresh()
    episodic_sandbox.database_url = databases.url(name)
    yield episodic_sandbox.database_url
    from episodic.storage.registry import dispose_all

    dispose_all()
    databases.drop(name)


@pytest.fixture(scope="session")
def episodic_prefect() -> Iterator[None]:
    """Prefect's test harness for the session (its own temporary database and API)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
