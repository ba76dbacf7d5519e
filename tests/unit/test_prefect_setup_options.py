"""`episodic prefect setup --approval-wait`: what the option takes, and with what."""

from __future__ import annotations

import socket

import pytest

from tests.unit.test_starter_files import cli


@pytest.mark.parametrize("text", ["\uff14h", "\u0664h", "\u09eam"])  # fullwidth, Arabic, Bengali 4
def test_approval_wait_takes_ascii_digits_only(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`\\d` in a Python pattern matches any Unicode digit (a fullwidth 4 and `h` would be 4
    hours); the project's integer options take ASCII digits only (docs/cli.md)."""
    from episodic.cli.prefect_setup import _approval_wait_s
    from episodic.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="--approval-wait"):
        _approval_wait_s(text)


def test_approval_wait_without_notify_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`episodic prefect setup --approval-wait 30m` (the --notify forgotten) would create
    no automation while the user believes a 30 min notification is set: refused before any
    work, one line, exit 2 (an option combination)."""
    with socket.socket() as probe:  # a port nothing listens on: no Prefect server is reached
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{port}/api")
    code, _, err = cli(capsys, "prefect", "setup", "--approval-wait", "30m")
    assert code == 2, err
    assert "--notify" in err and len(err.splitlines()) == 1, err
