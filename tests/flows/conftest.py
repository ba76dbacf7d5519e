"""One Prefect test harness (a real local API server on a temporary database) per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import episodic.tasks  # noqa: F401  (Prefect defaults first)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def harness(prefect_harness: None, database_url: str) -> str:
    """The harness plus a fresh project database; returns its URL."""
    return database_url
