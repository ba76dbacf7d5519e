"""The generate flow stops buying at its first paid image the media store cannot take, and
running it again completes the episode: one provider job per item (the fake's own log)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.ids import WeekId
from episodic.flows.generate import generate_episode
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from episodic.storage.engine import make_engine
from tests.fs_faults import can_mount, read_only_folder
from tests.generation import image_keys, jobs_per_key, write_playlist

pytestmark = pytest.mark.slow

ITEMS = 10


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


@pytest.mark.skipif(not can_mount(), reason="a read-only mount needs root")
def test_the_flow_stops_buying_at_a_store_failure_and_running_it_again_completes(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "300")
    folder = tmp_path / "media"
    folder.mkdir()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(folder))
    engine = make_engine(harness)
    try:
        episode = str(
            allocate(engine, "weekly", WeekId.parse("2026-W32"), "k-store").episode.episode_id
        )
        playlist = write_playlist(tmp_path / "p", [f"t{n}" for n in range(ITEMS)])
        record_plan(engine, "weekly", episode, playlist)
        completed = "SELECT count(*) FROM items WHERE state = 'completed'"
        with contextlib.ExitStack() as sealed:

            def seal_after_two() -> None:  # the store turns read-only under the flow run
                deadline = time.monotonic() + 120
                while _count(engine, completed) < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                sealed.enter_context(read_only_folder(folder))

            sealing = threading.Thread(target=seal_after_two, daemon=True)
            sealing.start()
            state = generate_episode(episode_id=episode, concurrency=2, return_state=True)
            sealing.join(timeout=120)
        assert state.is_failed() and "stopped buying" in str(state.message)
        assert str(folder) in str(state.message)
        assert (
            _count(
                engine,
                "SELECT count(*) FROM runs WHERE state = 'paused' AND "
                "error_text LIKE 'stopped buying:%'",
            )
            == 1
        )
        bought = jobs_per_key()
        assert set(bought.values()) == {1} and len(bought) < ITEMS
        result = generate_episode(episode_id=episode, concurrency=2)  # the store is back
        assert result["state"] == "completed"
        made = jobs_per_key()
        assert len(made) == ITEMS and set(made.values()) == {1}  # one job per item, ever
        assert len(image_keys(engine)) == ITEMS
    finally:
        engine.dispose()
