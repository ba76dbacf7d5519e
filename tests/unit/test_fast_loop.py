"""`make test-fast` starts no servers: the tests that would are marked `servers` and left
out, and one that would start a server without the mark fails instead of starting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fast_loop import no_servers_in_the_fast_loop
from tests.s3_server import S3Server


def test_a_server_started_in_the_fast_loop_fails_with_what_to_mark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EPISODIC_TEST_NO_SERVERS", "1")
    with pytest.raises(RuntimeError, match="starts a PostgreSQL database: mark it"):
        no_servers_in_the_fast_loop("a PostgreSQL database")
    with pytest.raises(RuntimeError, match=r"starts the S3 server: mark it pytest\.mark\.servers"):
        S3Server(tmp_path / "s3").start()
    assert not (tmp_path / "s3").exists()


def test_outside_the_fast_loop_the_guard_lets_servers_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EPISODIC_TEST_NO_SERVERS", raising=False)
    no_servers_in_the_fast_loop("a PostgreSQL database")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_test_of_the_s3_kind_is_marked_servers(kind: str, request: pytest.FixtureRequest) -> None:
    marked = request.node.get_closest_marker("servers") is not None
    assert marked == (kind == "s3")
