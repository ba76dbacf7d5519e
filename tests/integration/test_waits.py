"""Runs hold no database connection while they wait on nothing (issue 11).

A run waits for two things: a provider slot held by another run (the limit in the claim) and
a slow provider job (collect). Every connection the engine checks out of its pool is timed
from checkout to checkin; a connection held across either wait would be held for the wait's
length. Here each wait is at least a second and a half, and no checkout may span one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from core.exit_codes import ExitCode
from core.ids import WeekId
from pipeline.allocation import allocate
from tests.generation import Episode, jobs_per_key, write_playlist

DELAY_MS = 1500  # every job takes this long at the provider: the collect wait


class _Holds:
    """How long each pooled connection stayed checked out, in seconds."""

    def __init__(self, engine: Engine) -> None:
        self.out: dict[int, float] = {}
        self.longest = 0.0
        self.count = 0
        self.lock = threading.Lock()
        event.listen(engine.pool, "checkout", self._checkout)
        event.listen(engine.pool, "checkin", self._checkin)

    def _checkout(self, dbapi_conn: object, record: object, proxy: object) -> None:
        with self.lock:
            self.out[id(record)] = time.monotonic()

    def _checkin(self, dbapi_conn: object, record: object) -> None:
        with self.lock:
            started = self.out.pop(id(record), None)
            if started is not None:
                self.longest = max(self.longest, time.monotonic() - started)
                self.count += 1


def test_no_connection_is_held_while_a_run_waits_for_a_slot_or_a_job(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  one-at-a-time:\n    kind: fake\n    cost_per_image_minor: 4\n"
        f"    max_concurrency: 1\n    delay_ms: {DELAY_MS}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    episodes = []
    for n in range(2):
        episode_id = str(
            allocate(engine, "weekly", WeekId.parse("2026-W32"), f"wait-{n}").episode.episode_id
        )
        episode = Episode(engine, episode_id)
        episode.plan(write_playlist(tmp_path / f"pl{n}", [f"w{n}"], profile="one-at-a-time"))
        episodes.append(episode)
    holds = _Holds(engine)
    outcomes: list[int] = []
    started = time.monotonic()
    threads = [
        threading.Thread(target=lambda e=e: outcomes.append(int(e.generate().exit_code)))
        for e in episodes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    elapsed = time.monotonic() - started
    assert outcomes == [ExitCode.OK, ExitCode.OK]
    assert len(jobs_per_key()) == 2 and set(jobs_per_key().values()) == {1}
    # One slot, two jobs of 1.5 s each: one run waited for the slot, both for their job.
    assert elapsed >= 2 * DELAY_MS / 1000
    assert holds.count > 0 and not holds.out, "a connection was never given back"
    assert holds.longest < DELAY_MS / 1000 / 2, f"a connection was held {holds.longest:.2f} s"
