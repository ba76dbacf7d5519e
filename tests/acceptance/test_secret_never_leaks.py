"""The provider's secret never leaves the request to the provider: not
in any output (human or --json), log or error message, not in any file the project writes,
not in the database, and not in any request to another host than the provider's. Tried
through the real `episodic` command against a local HTTP provider whose outputs live on a
second origin, with faults that take every error path (a 502 after the job was made, a 401
and bad JSON on polls, a 404 on download, a refused create, a failed job)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from tests.generation import write_playlist
from tests.http_server import TOKEN, PredictionsServer

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
FAULTS = [
    "plain",
    "[[CREATED_502]]",
    "[[POLL_401]] [[POLL_BADJSON]]",
    "[[DOWNLOAD_404]]",
    "[[REFUSE_422]]",
    "[[REMOTE_FAIL]]",
]


def test_the_provider_secret_appears_nowhere_but_in_its_requests(
    cli: Cli, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Path(os.environ["EPISODIC_HOME"])
    with PredictionsServer(output_host=True) as server:
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(
            "profiles:\n  http-secret:\n    kind: http\n"
            f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
            "    cost_per_image_minor: 5\n    timeout_s: 1\n    poll_interval_s: 0.05\n"
            "    idempotent_create: true\n"
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
        monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
        outputs = [cli("allocate", "--key", "secret", "--week", "2026-W32")]
        playlist = write_playlist(tmp_path / "pl", FAULTS, profile="http-secret")
        outputs.append(cli("plan", "2026-W32-0", "--playlist", str(playlist)))
        for args in (
            ("generate", "2026-W32-0", "--plan"),
            ("generate", "2026-W32-0"),
            ("generate", "2026-W32-0", "--json"),
            ("retry", "2026-W32-0", "--json"),
            ("runs", "list", "--json"),
            ("check", "--all", "--json"),
            ("check", "--all"),
            ("episodes", "show", "2026-W32-0", "--json"),
        ):
            outputs.append(cli(*args, env={"EPISODIC_DEBUG": "1"}))  # tracebacks included
        assert sum(server.jobs_made.values()) >= 4  # the paid path ran, with its errors
        api = [r for r in server.requests if not r.path.startswith("/v1/files/")]
        assert api and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in api)
        assert server.files is not None and server.files.requests  # the other origin
        for request in server.files.requests:
            assert TOKEN not in request.path and TOKEN not in str(request.headers)
    for result in outputs:
        assert TOKEN not in result.stdout and TOKEN not in result.stderr, result.args
    for path in home.rglob("*"):  # images, manifests, the SQLite database, logs, state
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    from episodic.storage.engine import make_engine

    engine = make_engine(database_url)
    with engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                assert TOKEN not in str(tuple(row)), table
    engine.dispose()
