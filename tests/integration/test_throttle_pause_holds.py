"""A throttle longer than the bound pauses the run and holds: counted at the Replicate
stand-in's side (its own create requests, jobs made and bills), through the real `episodic`
command on SQLite.

- the moment the provider asked for is honoured by the next `generate` of the same episode
  too (the wait is recorded for the profile: every claim of a new paid call is refused until
  then), so no create reaches the provider inside the window it asked for;
- the paused run's items are not failed (a pause is not a failure of the items).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from tests.integration.standin_cli import cli, planned, replicate_profile
from tests.standins import ReplicateStandIn

pytestmark = pytest.mark.slow


def test_a_run_paused_at_a_throttle_fails_none_of_its_items(home: Path) -> None:
    """The stand-in answers the first create 429 with ``Retry-After: 120``: the run pauses
    (exit 130) having sent one create and made nothing, and none of its items is failed
    (the intent was withdrawn: the item is still to buy when the run is resumed)."""
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox", "owl"])
        server.throttle(1, retry_after=120)
        first = cli("generate", episode, "--json", "--concurrency", "1")
        assert first.returncode == ExitCode.INTERRUPTED, first
        assert len(server.create_requests) == 1 and server.jobs_made_total == 0
        assert json.loads(first.stdout)["failed"] == 0, first.stdout


def test_a_generate_inside_the_throttle_window_sends_no_create(home: Path) -> None:
    """The stand-in answers the first create 429 with ``Retry-After: 120`` and the run
    pauses. A `generate` of the same episode a moment later is still inside the 120 s the
    provider asked for: it sends no create (any create sent is counted at the stand-in)."""
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox", "owl"])
        server.throttle(1, retry_after=120)
        first = cli("generate", episode, "--json", "--concurrency", "1")
        assert first.returncode == ExitCode.INTERRUPTED, first
        assert len(server.create_requests) == 1
        again = cli("generate", episode, "--json", "--concurrency", "1")
        assert len(server.create_requests) == 1, (server.jobs_made, again.stdout)
        assert server.jobs_made_total == 0 and server.bill_micros == 0


def test_a_throttle_asked_beyond_a_day_is_said_as_asked_and_held_a_day(home: Path) -> None:
    """The stand-in answers 429 with ``Retry-After`` of ten days. episodic holds a throttle a
    day at most (a typo or a date years ahead must not stop a weekly pipeline for good), and
    the run's message says both: the provider asked for 864000 s, and episodic asks again a
    day from now; it never presents the day as the provider's ask."""
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox"])
        server.throttle(1, retry_after=864_000)
        first = cli("generate", episode, "--json", "--concurrency", "1")
        assert first.returncode == ExitCode.INTERRUPTED, first
        message = json.loads(first.stdout)["message"]
        assert "it asked to wait 864000s (about 10 days)" in message, message
        assert "asked to wait 86400s" not in message, message
        assert '("Request was throttled. Expected available in 864000 seconds.")' in message
        assert "holds a throttle 86400s at most and asks the provider again from" in message
        # a later run pauses at its first claim, on the throttle recorded: it says so, and
        # never presents what is left of the day as the provider's ask
        again = cli("generate", episode, "--json", "--concurrency", "1")
        assert again.returncode == ExitCode.INTERRUPTED, again
        later = json.loads(again.stdout)["message"]
        assert "by a throttle recorded earlier" in later and "it asked to wait" not in later
        assert len(server.create_requests) == 1 and server.jobs_made_total == 0
