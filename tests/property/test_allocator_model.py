"""The allocator against a reference model, on SQLite and PostgreSQL: random
sequences of allocations, retries, a key asked for in another week, and several callers
asking for one new key at once."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import Engine, text

from episodic.core.errors import AllocationConflict
from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate

PIPELINE = "weekly"
WEEKS = [WeekId.parse(w) for w in ("2026-W01", "2026-W32", "2026-W53", "2027-W01")]
KEYS = st.sampled_from([f"key-{n}" for n in range(12)] + ["'; DROP TABLE episodes; --", "ключ"])


def test_the_allocator_follows_its_model(engine: Engine) -> None:
    class Allocator(RuleBasedStateMachine):
        """Model: key -> (week, sequence); sequences per week 0, 1, 2, ... in order of
        first allocation; a key's week never changes; nothing is written on a conflict."""

        def __init__(self) -> None:
            super().__init__()
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM episode_events"))
                conn.execute(text("DELETE FROM episodes"))
            self.owned: dict[str, tuple[str, int]] = {}
            self.count: dict[str, int] = {}

        def _expect(self, key: str, week: WeekId) -> tuple[str, int] | None:
            if key in self.owned:
                return self.owned[key] if self.owned[key][0] == str(week) else None
            return (str(week), self.count.get(str(week), 0))

        def _record(self, key: str, got: tuple[str, int]) -> None:
            if key not in self.owned:
                self.owned[key] = got
                self.count[got[0]] = self.count.get(got[0], 0) + 1

        @rule(key=KEYS, week=st.sampled_from(WEEKS))
        def allocate_or_retry(self, key: str, week: WeekId) -> None:
            expected = self._expect(key, week)
            try:
                episode = allocate(engine, PIPELINE, week, key).episode
            except AllocationConflict:
                assert expected is None, (key, week, self.owned.get(key))
                return
            got = (str(episode.episode_id.week), episode.episode_id.sequence)
            assert got == expected, (key, week, got, expected)
            self._record(key, got)

        @rule(key=KEYS, week=st.sampled_from(WEEKS), callers=st.integers(2, 4))
        def callers_at_once(self, key: str, week: WeekId, callers: int) -> None:
            expected = self._expect(key, week)
            barrier = threading.Barrier(callers)
            answers: list[object] = []

            def ask() -> None:
                barrier.wait()
                try:
                    episode = allocate(engine, PIPELINE, week, key).episode
                    answers.append((str(episode.episode_id.week), episode.episode_id.sequence))
                except AllocationConflict as exc:
                    answers.append(exc)

            threads = [threading.Thread(target=ask) for _ in range(callers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            if expected is None:
                assert all(isinstance(a, AllocationConflict) for a in answers), answers
                return
            assert answers == [expected] * callers, (answers, expected)
            self._record(key, expected)

        @invariant()
        def the_database_is_the_model(self) -> None:
            with engine.connect() as conn:
                rows = conn.execute(
                    text("SELECT allocation_key, week_id, sequence FROM episodes")
                ).all()
                events = conn.execute(
                    text("SELECT count(*) FROM episode_events WHERE kind = 'allocated'")
                ).scalar_one()
            assert {key: (week, seq) for key, week, seq in rows} == self.owned
            assert len(rows) == len(self.owned) == events  # no duplicate, nothing partial

    run_state_machine_as_test(
        Allocator,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize("key", ["", " ", "x" * 513, "a\x00b"])
def test_malformed_keys_are_refused_before_anything_is_written(engine: Engine, key: str) -> None:
    from episodic.core.errors import EpisodicError

    with pytest.raises(EpisodicError):
        allocate(engine, PIPELINE, WEEKS[0], key)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM episodes")).scalar_one() == 0
