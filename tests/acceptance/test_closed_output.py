"""A reader that closes the output early (`episodic … | head -1`) ends the command with 141,
as a shell reports a command a closed pipe ended, and nothing on stderr: 1 stays a crash."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.acceptance.conftest import EPISODIC


def _with_closed_stdout(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run `episodic` with stdout a pipe whose reader closed before the command wrote."""
    assert EPISODIC is not None
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [EPISODIC, *args], stdout=write, stderr=subprocess.PIPE, timeout=120, check=False
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args", [("--help",), ("episodes", "list"), ("check", "--all")], ids=" ".join
)
def test_a_closed_output_ends_the_command_with_141_and_says_nothing(
    args: tuple[str, ...], database_url: str
) -> None:
    done = _with_closed_stdout(*args)
    assert (done.returncode, done.stderr) == (141, b"")


def test_a_group_without_its_command_names_what_is_missing(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("episodes")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: give a command (see: episodic episodes --help)"
