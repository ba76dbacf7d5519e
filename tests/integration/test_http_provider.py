"""The HTTP provider against a real local server that injects faults, through the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from episodic.core.errors import EpisodeNotFound, ProviderConfigError
from episodic.core.exit_codes import ExitCode
from episodic.core.settings import load_settings
from episodic.pipeline.gate import build_provider, open_gate
from episodic.providers.profiles import Profile
from episodic.storage.models import SubmissionRow
from tests.generation import Episode, new_episode, write_playlist
from tests.http_server import TOKEN, PredictionsServer


@pytest.fixture
def server() -> Iterator[PredictionsServer]:
    with PredictionsServer() as running:
        yield running


@pytest.fixture
def episode(
    engine: Engine,
    database_url: str,
    server: PredictionsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Episode:
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n"
        "  http-test:\n"
        "    kind: http\n"
        f"    base_url: {server.base_url}\n"
        "    credential_env: TEST_IMAGE_TOKEN\n"
        "    cost_per_image_minor: 5\n"
        "    max_concurrency: 4\n"
        "    timeout_s: 1\n"
        "    poll_interval_s: 0.05\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.setenv("TEST_IMAGE_TOKEN", TOKEN)
    return new_episode(engine)


def plan(episode: Episode, tmp_path: Path, titles: list[str]) -> None:
    episode.plan(write_playlist(tmp_path / "playlist", titles, profile="http-test"))


def test_a_run_over_http_completes_and_pays_once_per_item(
    episode: Episode, server: PredictionsServer, tmp_path: Path
) -> None:
    plan(episode, tmp_path, ["a", "b", "c"])
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK and outcome.counts.cost_micros == 150_000
    assert outcome.counts.cost_micros == server.bill_micros  # the provider's own bill
    assert sorted(server.accepted.values()) == [1, 1, 1]
    assert episode.generate().counts.paid_submissions == 0
    assert sum(server.create_calls.values()) == 3


# A 5xx on create proves nothing (the job may exist): it is an unknown outcome, not retried; see
# the CREATED_502 case below and tests/unit/test_http_provider_faults.py.
@pytest.mark.parametrize("marker", ["[[HTTP_429:2]]"])
def test_refusals_before_acceptance_are_retried_with_the_same_idempotency_key(
    episode: Episode, server: PredictionsServer, tmp_path: Path, marker: str
) -> None:
    plan(episode, tmp_path, [f"busy {marker}"])
    assert episode.generate().exit_code == ExitCode.OK
    (key,) = server.create_calls
    assert server.create_calls[key] == 3 and server.accepted[key] == 1


# Every fault after acceptance: tests/integration/test_provider_faults.py.


def test_a_wrong_credential_is_a_permanent_failure(
    episode: Episode, server: PredictionsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_IMAGE_TOKEN", "wrong")
    plan(episode, tmp_path, ["a"])
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.RUN_FAILED
    assert not server.accepted
    with episode.engine.connect() as conn:
        error = conn.execute(select(SubmissionRow.error_text)).scalar_one()
    assert "401" in error and "wrong" not in error


def test_a_missing_credential_stops_before_any_call(
    episode: Episode, server: PredictionsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_IMAGE_TOKEN")
    plan(episode, tmp_path, ["a"])
    with pytest.raises(ProviderConfigError, match=r"\$TEST_IMAGE_TOKEN is not set"):
        episode.generate()
    assert not server.create_calls


class CredentialSpy:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, profile: Profile) -> str:
        self.reads.append(profile.id)
        return TOKEN


def test_a_missing_episode_never_reads_the_credential_nor_builds_a_client(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(log))
    spy = CredentialSpy()
    profile = Profile(id="p", kind="fake", cost_per_image_minor=1, credential_env="X")
    with pytest.raises(EpisodeNotFound):
        gate = open_gate(engine, "weekly", "2026-W32-0", "generate")
        build_provider(gate, profile, spy, load_settings())
    assert spy.reads == [] and not log.exists()
    with pytest.raises(TypeError, match="GatePass"):
        build_provider(object(), profile, spy, load_settings())  # type: ignore[arg-type]
    assert spy.reads == [] and not log.exists()
    new_episode(engine)  # the control: an existing episode does build, and reads once
    build_provider(
        open_gate(engine, "weekly", "2026-W32-0", "generate"), profile, spy, load_settings()
    )
    assert spy.reads == ["p"] and '"client_built"' in log.read_text()
