"""How a generation run is shown: its progress bar while it works, and its outcome.

`episodic generate`, `retry` and `runs resume` show a run alike. An interrupt tells the run
directly (`episodic.cli.signals`), and the outcome, interrupted included, is the command's own
answer: the console script adds no line after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from episodic.cli.output import emit_json
from episodic.cli.signals import interrupts

if TYPE_CHECKING:
    from episodic.pipeline.generation import OnStart
    from episodic.pipeline.outcomes import RunOutcome
    from episodic.pipeline.runner import Runner


@contextmanager
def run_progress(as_json: bool) -> Iterator[OnStart]:
    """A progress bar over the run's items, shown once the run is known (a refused request
    prints nothing but its one-line error)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shown: list[Progress] = []

    def on_start(engine: Runner, run_id: str) -> None:
        def interrupted() -> None:  # also when the KeyboardInterrupt itself is swallowed
            engine.interrupted.set()
            engine.stop.set()

        interrupts.on_signal(interrupted)
        if as_json:
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        )
        progress.start()
        shown.append(progress)
        working = f"generating {engine.gate.episode_id}"
        task = progress.add_task(working, total=len(engine.store.run_items(run_id)))
        engine.on_progress = lambda item, result: progress.advance(task)
        engine.on_wait = lambda text: progress.update(task, description=text or working)

    try:
        yield on_start
    finally:
        for progress in shown:
            progress.stop()


def report_outcome(outcome: RunOutcome, as_json: bool) -> None:
    from episodic.core.money import format_money

    interrupts.mark_reported()
    if as_json:
        emit_json(outcome.to_dict())
    else:
        counts = outcome.counts
        joined = (
            " (deduplicated: joined the run already working on this request; the figures "
            "below are that run's totals, not this process's)"
            if outcome.deduplicated
            else ""
        )
        typer.echo(
            # The run's figures, whichever process paid (a resume of a run a killed process
            # started shows that process's submissions too, not only this one's).
            f"{outcome.message}{joined}\n  completed {counts.completed}, skipped "
            f"{outcome.skipped}, failed {counts.failed}; the run's paid submissions "
            f"{counts.paid_submissions}, cost {format_money(counts.cost_micros, counts.currency)}"
            " (every process's that worked on it)"
        )
    raise typer.Exit(int(outcome.exit_code))
