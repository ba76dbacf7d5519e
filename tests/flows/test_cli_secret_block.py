"""A profile naming only ``credential_secret_block`` works on the command line when a Prefect
API is configured (PREFECT_API_URL): `providers check` reads the block through it (never
"names no credential_env", nor starts a temporary server); a block that does not exist is
one line, exit 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs_servers import TOKEN, ReplicateServer

pytestmark = pytest.mark.slow


@pytest.fixture
def replicate() -> Iterator[ReplicateServer]:
    with ReplicateServer() as server:
        yield server  # type: ignore[misc]


def test_providers_check_reads_a_secret_block_through_the_configured_prefect_api(
    prefect_harness: None,
    replicate: ReplicateServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    from episodic.cli.app import run

    Secret(value=TOKEN).save("rep-token", overwrite=True)
    monkeypatch.setenv("PREFECT_API_URL", str(PREFECT_API_URL.value()))
    (tmp_path / "providers.yaml").write_text(
        "profiles:\n"
        "  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {replicate.base_url}\n    credential_secret_block: rep-token\n"
        '    price: {per_image: "0.003"}\n'
        "  missing:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {replicate.base_url}\n    credential_secret_block: no-such-block\n"
        '    price: {per_image: "0.003"}\n'
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    capsys.readouterr()
    assert run(["providers", "check", "p", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["check"]
    assert shown["ok"] is True and "account episodic-test" in shown["message"]
    assert replicate.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert run(["providers", "check", "missing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Secret block 'no-such-block'" in err
    assert TOKEN not in err
