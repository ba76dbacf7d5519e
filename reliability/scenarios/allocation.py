"""Allocating processes killed (SIGKILL, SIGTERM) at random moments."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import statistics
import time
from contextlib import suppress
from typing import Any

from reliability.harness import PIPELINE, Backend, Result, open_engine, record_allocations


def _allocate_forever(url: str, prefix: str, out: Any) -> None:  # pragma: no cover - child
    """A forked child: allocate new keys in two weeks until killed, reporting each."""
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate

    engine = open_engine(url)
    weeks = [WeekId.parse("2026-W32"), WeekId.parse("2026-W33")]
    n = 0
    while True:
        key = f"{prefix}-{n}"
        episode = allocate(engine, PIPELINE, weeks[n % 2], key).episode.episode_id
        out.send((key, str(episode)))
        n += 1


def alloc_crash(backend: Backend, trials: int, rng: random.Random) -> Result:
    """kill -9 / SIGTERM of an allocating process at a random moment, `trials` times: no
    partial episode, no gap or duplicate, a retry of a reported key gets its episode, and the
    next allocation proceeds within a second."""
    from episodic.core.ids import EpisodeId, WeekId
    from episodic.pipeline.allocation import allocate

    result = Result("alloc-crash", backend.name)
    url = backend.fresh()
    engine = open_engine(url)
    context = multiprocessing.get_context("fork")
    waits: list[float] = []
    reported: list[tuple[str, str]] = []
    for trial in range(trials):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_allocate_forever, args=(url, f"t{trial}", send), daemon=True
        )
        child.start()
        send.close()
        time.sleep(rng.uniform(0.02, 0.4))
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
        os.kill(child.pid or 0, sig)
        child.join(30)
        result.faults[sig.name] += 1
        seen: list[tuple[str, str]] = []
        with suppress(EOFError, OSError):
            while receive.poll():
                seen.append(receive.recv())
        receive.close()
        started = time.monotonic()
        after = allocate(engine, PIPELINE, WeekId.parse("2026-W32"), f"after-{trial}")
        waits.append(time.monotonic() - started)
        reported.append((f"after-{trial}", str(after.episode.episode_id)))
        reported += seen
        for key, episode_id in rng.sample(seen, min(3, len(seen))) + seen[-1:]:
            week = EpisodeId.parse(episode_id).week
            again = str(allocate(engine, PIPELINE, week, key).episode.episode_id)
            if again != episode_id:
                result.lost += 1
                result.problem(f"key {key} had {episode_id}, a retry got {again}")
        result.trials += 1
    record_allocations(result, engine, reported)
    slowest = max(waits, default=0.0)
    if slowest >= 1.0:
        result.problem(f"an allocation after a kill waited {slowest:.2f} s (limit 1 s)")
    result.notes = (
        f"{len(reported)} allocations reported by the killed processes; the next allocation "
        f"after a kill: median {statistics.median(waits) * 1000:.0f} ms, max "
        f"{slowest * 1000:.0f} ms"
    )
    engine.dispose()
    return result
