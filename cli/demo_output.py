"""What `episodic demo` prints: one line per step as it happens, a compact summary, then what
to open (full paths, each on its own line: never a table cell a terminal's width cuts) and
what to try next. Nothing here imports Prefect.

Human output only: with ``--json`` the reporter is silent and stdout is the JSON document.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

NEXT_STEPS = (
    ("episodic demo --ui", "the same in Prefect's UI; one run awaits your approval"),
    ("episodic preview {episode}", "a contact sheet of an episode's images, titled"),
    ("episodic spend", "what the ledger says was paid"),
    ("episodic check --all", "the read-only audit"),
    ("episodic init", "your own providers file and playlist, to edit"),
    ("docs/providers.md", "a real provider from zero: Replicate, fal, HTTP"),
)


class Reporter:
    """Progress lines on stdout (flushed at once: a pipe shows them as they happen), one per
    step; each is also where an interrupt stops the demo."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stdout.isatty()

    def line(self, text: str = "") -> None:
        """Print a step's line; a Ctrl-C that a flow run swallowed on its way (Prefect's
        engine answers it inside the run) stops the demo here, at the next step."""
        from episodic.cli.signals import interrupts

        if interrupts.signalled.is_set():
            raise KeyboardInterrupt
        if not self.quiet:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    @contextmanager
    def waiting(self, label: str) -> Iterator[None]:
        """A spinner with the seconds spent while the block runs (a terminal only)."""
        if self.quiet or not self.tty:
            yield
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(), TextColumn(f"  {label}"), TimeElapsedColumn(), transient=True
        ) as spinner:
            spinner.add_task(label, total=None)
            yield

    @contextmanager
    def progress(self, label: str, total: int, done: Callable[[], int]) -> Iterator[None]:
        """A progress bar of `done()` out of `total` while the block runs (a terminal only;
        a pipe has the step's line and its result line)."""
        if self.quiet or not self.tty or total <= 0:
            yield
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        stop = threading.Event()
        with Progress(
            TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), transient=True
        ) as bar:
            task = bar.add_task(label, total=total)

            def poll() -> None:
                while not stop.wait(0.2):
                    try:
                        bar.update(task, completed=min(done(), total))
                    except Exception:  # a busy database: the next poll tries again
                        continue

            watcher = threading.Thread(target=poll, name="demo-progress", daemon=True)
            watcher.start()
            try:
                yield
            finally:
                stop.set()
                watcher.join()


def program() -> str:
    """How to type this command again here: ``episodic`` when that is what the shell finds,
    else the path that ran it (``.venv/bin/episodic`` after `make demo`, from the project)."""
    ran = Path(sys.argv[0])
    if ran.name != "episodic":  # python -m episodic.cli.entry, a test calling `run`
        return "episodic"
    found = shutil.which("episodic")
    if found is not None and Path(found).resolve() == ran.resolve():
        return "episodic"
    try:
        return str(ran.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(ran.absolute())


def summary(report: Reporter, story: dict[str, Any], ui: bool = False) -> None:
    """The episodes (a narrow table that fits 80 columns), then the files to open and the
    commands to try, each path on its own line."""
    if report.quiet:
        return
    episodes = story["episodes"]
    report.line()
    report.line(f"{'episode':<12}{'state':<11}{'paid calls':>11}  cost")
    for e in episodes:
        report.line(f"{e['episode_id']:<12}{e['state']:<11}{e['paid_calls']:>11}  {e['cost']}")
    report.line()
    report.line("open:")
    for e in episodes:
        if e.get("cover_path"):
            report.line(f"  cover of {e['episode_id']}:")
            report.line(f"    {e['cover_path']}")
            report.line(f"  manifest of {e['episode_id']}:")
            report.line(f"    {e['manifest_path']}")
    report.line()
    report.line("try next:")
    me = program()
    first = episodes[0]["episode_id"] if episodes else "EPISODE_ID"
    steps = [  # --ui: the UI's addresses follow, no need to suggest it
        (_readable(command.replace("episodic", me, 1).format(episode=first)), what)
        for command, what in NEXT_STEPS[ui:]
    ]
    width = max(len(command) for command, _ in steps) + 2
    for command, what in steps:
        report.line(f"  {command:<{width}}{what}")


def _readable(step: str) -> str:
    """A step naming a file of the project (``docs/...``) as a path that opens from here:
    relative in the project folder, else absolute."""
    if not step.startswith("docs/"):
        return step
    from episodic.core.home import project_folder

    project = project_folder()
    if project is None:
        return step
    path = project / step
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
