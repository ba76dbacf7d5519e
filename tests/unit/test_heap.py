"""A run keeps the objects alive at its start out of full garbage collections
(pipeline.heap), and gives them back when the process's last run ends."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from episodic.pipeline.heap import freeze_for_run, thaw_after_run


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@contextmanager
def a_run() -> Iterator[None]:
    """A run's span as the runner brackets it."""
    freeze_for_run()
    try:
        yield
    finally:
        thaw_after_run()


def test_objects_alive_when_a_run_starts_are_frozen_until_it_ends() -> None:
    before = object.__new__(type("Kept", (), {}))  # a tracked object alive at the start
    assert gc.get_freeze_count() == 0
    with a_run():
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # in the permanent generation
    assert gc.get_freeze_count() == 0
    assert any(o is before for o in gc.get_objects())  # collectable again


def test_garbage_a_run_makes_is_still_collected_during_it() -> None:
    class Node:
        other: object = None

    with a_run():
        node = Node()
        node.other = node  # a reference cycle: only the cyclic collector frees it
        gone = weakref.ref(node)
        del node
        gc.collect()
        assert gone() is None


def test_concurrent_runs_share_one_freeze_that_the_last_one_ends() -> None:
    started, release = threading.Event(), threading.Event()

    def other_run() -> None:
        with a_run():
            started.set()
            release.wait(10)

    thread = threading.Thread(target=other_run)
    freeze_for_run()
    thread.start()
    assert started.wait(10)
    thaw_after_run()  # this run ends first: the other still runs frozen
    assert gc.get_freeze_count() > 0
    release.set()
    thread.join(10)
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_by_someone_else_is_left_as_it_is() -> None:
    kept = object.__new__(type("Kept", (), {}))  # frozen by someone else's freeze
    gc.freeze()
    with a_run():
        pass
    # The other freeze still holds (its count may shrink as frozen objects are freed, so
    # the object itself is what is checked): still in the permanent generation.
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())
