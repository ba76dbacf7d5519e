"""`episodic providers check` names the URL it could not reach, and a URL is text like any
other: the profile's credential never appears in what it prints, even when a ``base_url`` was
written with the token in its path (a gateway-style URL pasted by mistake)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.conftest import EPISODIC
from tests.standins import replicate as replicate_standin

pytestmark = pytest.mark.slow


def test_providers_check_of_a_dead_port_never_prints_the_credential(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = replicate_standin.TOKEN
    providers = tmp_path / "providers.yaml"
    providers.write_text(
        "profiles:\n  paid:\n"
        f"    kind: replicate\n    model: {replicate_standin.OFFICIAL_MODEL}\n"
        f"    base_url: http://127.0.0.1:{port}/{token}/v1\n    credential_env: REPLICATE_KEY\n"
        '    price: {per_image: "0.003"}\n    timeout_s: 2.0\n'
    )
    env = dict(
        os.environ,
        EPISODIC_HOME=str(tmp_path / "home"),
        EPISODIC_PROVIDERS_FILE=str(providers),
        REPLICATE_KEY=token,
    )
    env.pop("EPISODIC_DATABASE_URL", None)
    assert EPISODIC is not None
    done = subprocess.run(
        [EPISODIC, "providers", "check", "paid"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert "127.0.0.1" in done.stdout + done.stderr
    assert token not in done.stdout + done.stderr, done.stdout[-300:]
