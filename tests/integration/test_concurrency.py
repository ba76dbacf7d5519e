"""Concurrent allocation from real OS processes is serialized by the pipeline lock."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from sqlalchemy import Engine

from episodic.core.ids import WeekId
from episodic.storage.episodes import EpisodeRepository

PROCESSES = 8
KEYS = 50
REQUESTS_PER_KEY = 4


@pytest.mark.slow
def test_concurrent_processes_get_exactly_one_episode_per_key(
    engine: Engine, database_url: str
) -> None:
    keys = [f"scheduled:weekly/{n:02d}" for n in range(KEYS)]
    rng = random.Random(7)
    plans: list[list[str]] = [[] for _ in range(PROCESSES)]
    for key in keys:  # every key goes to several different processes
        for worker in rng.sample(range(PROCESSES), REQUESTS_PER_KEY):
            plans[worker].append(key)
    for plan in plans:
        rng.shuffle(plan)

    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration._allocation_worker",
                database_url,
                "2026-W32",
                json.dumps(plan),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for plan in plans
    ]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    answers: list[list[object]] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=300)
        assert worker.returncode == 0
        answers.extend(json.loads(out))

    assert len(answers) == KEYS * REQUESTS_PER_KEY
    by_key: dict[str, set[str]] = {}
    for key, episode_id, _created in answers:
        by_key.setdefault(str(key), set()).add(str(episode_id))
    assert all(len(ids) == 1 for ids in by_key.values()), "a key got two episodes"
    assert sum(1 for *_, created in answers if created) == KEYS

    episodes = EpisodeRepository(engine).list("weekly", WeekId.parse("2026-W32"))
    assert sorted(e.sequence for e in episodes) == list(range(KEYS))
    assert {e.allocation_key for e in episodes} == set(keys)
    assert {e.allocation_key: str(e.episode_id) for e in episodes} == {
        key: ids.pop() for key, ids in by_key.items()
    }
