"""A create refused 422 (the provider's validation of our input: Replicate answers a problem
document naming the input field) is refused again, the same way, for the same input: the run's
last line names the real next step (the input to fix: the profile's or the playlist's, which
`episodic providers check` verifies without spending), never a bare resume that sends the
same input again. Counted at the Replicate stand-in's side, through the real `episodic`
command on SQLite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.standin_cli import cli, planned, replicate_profile
from tests.standins import ReplicateStandIn

pytestmark = pytest.mark.slow


def test_a_422_names_the_input_to_fix_not_a_resume_that_sends_it_again(home: Path) -> None:
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox"])
        detail = "input.aspect_ratio: value is not one of the allowed values"
        server.refuse(2, 422, {"title": "Input validation failed", "detail": detail, "status": 422})
        done = cli("generate", episode, "--json")
        message = json.loads(done.stdout)["message"]
        assert server.jobs_made_total == 0
        assert "aspect_ratio" in message, message
        assert "resume with" not in message, message
