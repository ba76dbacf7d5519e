"""A 503 that carries a ``Retry-After`` made nothing (docs/providers.md: "429, or 503 with
`Retry-After`: throttled, nothing created"), whatever form the header's value takes:
docs/generation.md says a value that is neither seconds nor an HTTP date is ignored and a
short backoff used. Such a create is sent again and the run completes with one prediction;
it never becomes an unknown outcome that an operator must hunt for at the provider (there is
nothing to find) and that only ``--force-resubmit`` gets past. Counted at the Replicate
stand-in's side (its own predictions), through the real `episodic` command on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from tests.integration.standin_cli import cli, planned, replicate_profile
from tests.standins import ReplicateStandIn

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("retry_after", ["1.5", "-5", "99999999999999999999999"])
def test_a_503_with_a_retry_after_of_another_form_is_waited_out_and_bought_once(
    home: Path, retry_after: str
) -> None:
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox"])
        server.unavailable(1, retry_after=retry_after)
        done = cli("generate", episode)
        assert server.jobs_made_total == 1, (server.jobs_made, done.stdout)
        assert done.returncode == ExitCode.OK, done.stdout
        assert server.bill_micros == 3_000
