"""Runs hold no database connection while they wait on nothing.

A run waits for two things: a provider slot held by another run (the limit in the claim) and
a slow provider job (collect). Every connection the engine checks out of its pool is recorded
from checkout to checkin; the provider's own log says when each job was made and collected.
No checkout may hold through the middle half of a job: that is both the collect wait and,
for the first job, the other run's wait for the slot.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from episodic.core.exit_codes import ExitCode
from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from tests.generation import Episode, jobs_per_key, provider_log, write_playlist

DELAY_MS = 1500  # every job takes this long at the provider: the collect wait


class _Holds:
    """Each pooled connection's checkout, as (checked out, checked in) wall-clock times."""

    def __init__(self, engine: Engine) -> None:
        self.out: dict[int, float] = {}
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        event.listen(engine.pool, "checkout", self._checkout)
        event.listen(engine.pool, "checkin", self._checkin)

    def _checkout(self, dbapi_conn: object, record: object, proxy: object) -> None:
        with self.lock:
            self.out[id(record)] = time.time()

    def _checkin(self, dbapi_conn: object, record: object) -> None:
        with self.lock:
            started = self.out.pop(id(record), None)
            if started is not None:
                self.spans.append((started, time.time()))


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
    threads = [
        threading.Thread(target=lambda e=e: outcomes.append(int(e.generate().exit_code)))
        for e in episodes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == [ExitCode.OK, ExitCode.OK]
    assert len(jobs_per_key()) == 2 and set(jobs_per_key().values()) == {1}
    events = provider_log()
    made = sorted(e["at"] for e in events if e["event"] == "job_created")
    collected = sorted(e["at"] for e in events if e["event"] == "collect")
    # One slot: the second job was made only after the first was collected (a slot wait).
    assert len(made) == len(collected) == 2 and made[1] >= collected[0]
    jobs = list(zip(made, collected, strict=True))
    assert holds.spans and not holds.out, "a connection was never given back"
    # Bookkeeping happens at a job's ends (accept, complete) and in short probes (a claim
    # refused for the slot, a heartbeat); no checkout may cover the middle half of a job,
    # which is both a collect wait and, for the first job, the other run's slot wait.
    halves = [(m + (c - m) / 4, c - (c - m) / 4) for m, c in jobs]
    spanning = [(a, b) for a, b in holds.spans for lo, hi in halves if a <= lo and b >= hi]
    assert not spanning, f"a connection was held across a wait: {spanning}"
