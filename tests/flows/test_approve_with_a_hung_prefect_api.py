"""`episodic approve` when the Prefect API holding the waiting run accepts connections but
never answers (a hung or overloaded server, a proxy that lost its upstream)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.flows.test_decision_resumes_run import _episodic, waiting
from tests.flows.test_prefect_path import _episode_state

pytestmark = pytest.mark.slow

__all__ = ["waiting"]  # the fixture: a weekly slot run at its form


@pytest.fixture
def silent_api() -> Iterator[str]:
    """A TCP server that accepts every connection and never says a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/api"
    stop.set()
    listener.close()
    for conn in held:
        conn.close()


def test_approve_with_a_prefect_api_that_never_answers_records_and_ends(
    harness: str, waiting: Any, silent_api: str
) -> None:
    """Prefect's own client would wait on the silent API for minutes (its 60 s request
    timeout, retried), and a shell, cron job or CI step calling `approve` would hang that
    long; `_episodic` gives it 120 s (TimeoutExpired). As for an unreachable server: the
    decision recorded, one `prefect:` line saying no waiting run was resumed, exit 0,
    promptly."""
    done = _episodic("approve", "2026-W32-0", "--by", "carol", api=silent_api)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2026-W32-0 is now approved", lines
    assert lines[1].startswith("  prefect: ") and "resumed the waiting" not in lines[1], lines
    assert _episode_state(harness) == "approved"
