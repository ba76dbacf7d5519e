"""One Prefect test harness (a real local API server on a temporary database) per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import episodic.tasks  # noqa: F401  (Prefect defaults first)
from tests.fast_loop import no_servers_in_the_fast_loop


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    no_servers_in_the_fast_loop("a Prefect test harness")
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def harness(prefect_harness: None, database_url: str) -> str:
    """The harness plus a fresh project database; returns its URL."""
    return database_url
