"""`make test-fast` starts no servers: what starts one calls `no_servers_in_the_fast_loop`
first, so a test `tests/conftest.py` did not mark `servers` fails instead of starting it."""

from __future__ import annotations

import os


def no_servers_in_the_fast_loop(what: str) -> None:
    """Raise when `make test-fast` (EPISODIC_TEST_NO_SERVERS=1) would start `what`: the test
    needs the `servers` mark (`tests/conftest.py`), not a silent server."""
    if os.environ.get("EPISODIC_TEST_NO_SERVERS") == "1":
        raise RuntimeError(
            f"make test-fast starts no servers, and this test starts {what}: mark it "
            "pytest.mark.servers"
        )
