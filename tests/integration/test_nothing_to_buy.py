"""A generate with nothing to buy needs no provider: every image of the plan completed, the
command (or a weekly run resumed on another worker) reads no credential, builds no client
and answers "nothing to do" (machine B's generate step, with all 14 items done on machine
A, needs no client). On SQLite and Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from episodic.core.planning import RunOptions
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.generation import generate
from episodic.providers.profiles import Profile
from tests.generation import new_episode, provider_log, write_playlist


class Refuse:
    def read(self, profile: Profile) -> str:
        raise AssertionError("a credential was read")


def _clients_built() -> int:
    return len([e for e in provider_log() if e["event"] == "client_built"])


def test_with_every_image_completed_no_credential_is_read_and_no_client_built(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    assert episode.generate().counts.completed == 2
    built = _clients_built()
    # the store is gone too: with nothing to store it is not probed either
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(tmp_path / "no-such-folder"))

    outcome = generate(
        engine, load_settings(), "weekly", episode.episode_id, RunOptions(), Refuse()
    )

    assert outcome.state == RunState.COMPLETED and outcome.exit_code == 0
    assert "all 2 items already completed; nothing to do" in outcome.message
    assert _clients_built() == built


def test_with_an_item_left_to_buy_the_credential_is_read_first(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side: work to do still builds the provider (the fake reads no credential:
    its client is what is counted)."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    assert episode.generate(only=frozenset({1})).counts.completed == 1
    built = _clients_built()

    outcome = generate(
        engine, load_settings(), "weekly", episode.episode_id, RunOptions(), Refuse()
    )
    assert outcome.counts.completed == 1 and _clients_built() == built + 1
