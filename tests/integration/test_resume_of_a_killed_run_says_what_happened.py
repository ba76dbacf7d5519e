"""`episodic runs resume` of a run whose process was killed (kill -9) while its prediction
was in flight collects that prediction (billed once at the Replicate stand-in) and its closing
line states only what happened: this process took the run over and collected it; it did not
join a run "already working on this request" (nothing was working on it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from tests.acceptance.conftest import EPISODIC
from tests.integration.standin_cli import cli, planned, replicate_profile
from tests.standins import ReplicateStandIn

pytestmark = pytest.mark.slow


def test_resume_of_a_killed_run_does_not_say_it_joined_a_working_run(home: Path) -> None:
    server = ReplicateStandIn()
    with server:
        episode = planned(home, replicate_profile(server), ["fox"])
        server.script("fox", polls=None)  # in flight until the test ends it
        assert EPISODIC is not None
        generate = subprocess.Popen(
            [EPISODIC, "generate", episode],
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while server.jobs_made_total < 1 and generate.poll() is None:
            time.sleep(0.05)
        generate.send_signal(signal.SIGKILL)
        generate.wait()
        (prediction,) = list(server.predictions)
        server.finish(prediction, "succeeded")
        listed = json.loads(cli("runs", "list", "--json").stdout)
        resumed = cli("runs", "resume", listed[0]["run_id"])
        assert resumed.returncode == ExitCode.OK, resumed
        assert server.bill_micros == 3_000, server.bills
        assert "joined the run already working" not in resumed.stdout, resumed.stdout
