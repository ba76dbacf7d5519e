"""The fault suite's harness: fresh databases per backend, the record of one scenario on one
backend (`Result`), and what the scenarios share to run real processes against them: a
planned episode per trial on its own fake provider profile, the signal a trial sends, the
recovery (`episodic sweep`, then the one recovery command) and the counts after it, taken by
`reliability.oracle`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from reliability.oracle import audit_allocations, jobs_per_item, ledger_rows, leftovers

EPISODIC = str(Path(sys.executable).parent / "episodic")

PIPELINE = "weekly"


@dataclass
class Result:
    """One scenario on one backend, as counted in this run."""

    scenario: str
    backend: str
    trials: int = 0
    faults: Counter[str] = field(default_factory=Counter)  # fault injected -> times
    paid_jobs: int | None = None  # jobs the provider made (its own log or server)
    logical_items: int | None = None  # items that had to be paid once each
    episodes: int | None = None  # of the allocations reported to callers, those in the database
    keys: int | None = None  # allocations reported to callers (key -> episode id)
    stuck: int | None = None  # runs or items left running, submissions left open (None:
    # the scenario has no such rows to leave: allocation)
    lost: int = 0  # data lost: allocated episodes vanished, completed images missing or changed
    seed: int | None = None  # the run's --seed, for the rerun command
    scale: float = 1.0
    problems: list[str] = field(default_factory=list)
    notes: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.problems and not self.stuck and self.lost == 0

    def problem(self, text_: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text_)

    def rerun(self) -> str:
        """The command that repeats this scenario alone, with the same random choices."""
        scale = f" --scale {self.scale:g}" if self.scale != 1.0 else ""
        seed = f" --seed {self.seed}" if self.seed is not None else ""
        return (
            f".venv/bin/python -m reliability --only {self.scenario} --backend {self.backend}"
            f"{scale}{seed}"
        )


@dataclass
class Backend:
    """Fresh databases of one kind for the scenarios (dropped at the end)."""

    name: str
    root: Path
    _pg: Any = None
    _sqlite: Any = None
    _made: list[str] = field(default_factory=list)
    _count: int = 0

    def fresh(self) -> str:
        """A migrated database of this kind (the test suite's factories: a copied SQLite
        template, a Postgres database cloned from a migrated template)."""
        from tests.databases import PostgresDatabases, SqliteDatabases

        self._count += 1
        if self.name == "sqlite":
            if self._sqlite is None:
                self.root.mkdir(parents=True, exist_ok=True)
                self._sqlite = SqliteDatabases(self.root)
            return str(self._sqlite.fresh(self.root / f"db{self._count}"))
        if self._pg is None:
            self._pg = PostgresDatabases()
        self._made.append(self._pg.fresh(migrated=True))
        return str(self._pg.url(self._made[-1]))

    def close(self) -> None:
        if self._pg is not None:
            for name in self._made:
                self._pg.drop(name)
            self._pg.close()


def open_engine(url: str) -> Engine:
    from episodic.storage.engine import make_engine

    return make_engine(url)


def record_allocations(result: Result, engine: Engine, reported: list[tuple[str, str]]) -> None:
    """The oracle's audit of the allocations reported to callers, into `result`."""
    audit = audit_allocations(engine, reported)
    for problem in audit.problems:
        result.problem(problem)
    result.keys = audit.reported
    result.episodes = audit.kept
    result.lost += audit.lost


_MARKERS = ["", "", "[[FAIL_TRANSIENT:1]]", "[[LOSE_RESPONSE]]", "[[DELAY_MS:900]]"]

_SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]


def trial_episode(
    engine: Engine, folder: Path, trial: int, items: int, rng: random.Random, profiles: Path
) -> tuple[str, str]:
    """An allocated, planned episode of `items` images on the trial's own provider profile
    (its own limit and slots: trials running at once do not throttle each other), from the
    providers file `profiles` (`fake_profiles`)."""
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from tests.generation import write_playlist

    profile = f"fake-t{trial}"
    episode_id = str(
        allocate(engine, PIPELINE, WeekId.parse("2026-W32"), f"gen-{trial}").episode.episode_id
    )
    titles = [f"t{trial} item {n} {rng.choice(_MARKERS)}".strip() for n in range(items)]
    playlist = write_playlist(folder, titles, profile=profile)
    record_plan(engine, PIPELINE, episode_id, playlist, providers_path=profiles)
    return episode_id, profile


def recover_and_check(
    result: Result,
    guard: threading.Lock,
    engine: Engine,
    env: dict[str, str],
    episode_id: str,
    items: int,
    home: Path,
    trial: int,
    processes: list[subprocess.Popen[str]],
    fault: str,
    *,
    signalled: dict[int, int] | None = None,
    cli: bool = False,
) -> None:
    """Wait for the killed (and surviving) processes, run the sweep and the one recovery
    command, then count: provider jobs per item from the provider's own log, items not
    completed, rows left running or open, `check` of the episode. With `signalled` (process
    index -> signal), a process that got no signal must have finished its run (exit 0),
    and with `cli`, a signalled `episodic` must have ended as documented (130, or the
    signal's own status, or 0 if it finished first; at most one line, no traceback). A
    failed trial keeps its forensics next to the provider log."""
    errors, outputs = [], []
    hung = False
    for process in processes:
        try:
            out, err = process.communicate(timeout=180)
            errors.append(err or "")
            outputs.append(out or "")
        except subprocess.TimeoutExpired:
            hung = True
            # PYTHONFAULTHANDLER (see trial_env): SIGABRT prints every thread's stack first
            process.send_signal(signal.SIGABRT)
            try:
                errors.append(process.communicate(timeout=10)[1] or "")
            except subprocess.TimeoutExpired:
                process.kill()
                errors.append(process.communicate()[1] or "")
            outputs.append("")
            with guard:
                result.problem(
                    f"trial {trial}: a process hung after {fault} (its threads' stacks: "
                    f"{home / 'forensics.txt'})"
                )
    after_kill = ledger_rows(engine, episode_id)
    if signalled is not None and not hung:
        for index, (process, err, out) in enumerate(zip(processes, errors, outputs, strict=True)):
            code, sig = process.returncode, signalled.get(index)
            if sig is None and code != 0:
                wrong = f"a process that got no signal exited {code}"
            elif (
                sig is not None
                and cli
                and sig != signal.SIGKILL
                and (
                    code not in (0, 130, -sig)
                    or len(err.strip().splitlines()) > 1
                    or "Traceback" in err
                )
            ):
                wrong = f"a process that got {signal.Signals(sig).name} exited {code}"
            else:
                continue
            with guard:
                said = last_words(out, err) or "(nothing)"
                (home / f"forensics-process{index}.txt").write_text(
                    f"{out}\n--- stderr\n{err}\n--- ledger\n{after_kill}"
                )
                result.problem(f"trial {trial} ({fault}): {wrong}: {said[-300:]} (see {home})")
    sweep = subprocess.run([EPISODIC, "sweep"], env=env, capture_output=True, text=True)
    recovery = subprocess.run(
        [EPISODIC, "generate", episode_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    check = subprocess.run([EPISODIC, "check", episode_id], env=env, capture_output=True, text=True)
    jobs = jobs_per_item(home)
    unfinished, stuck, lost = leftovers(engine, episode_id, media_root=home / "media")
    paid_once = len(jobs) == items and set(jobs.values()) == {1}
    forensics = home / "forensics.txt"
    if (
        hung
        or sweep.returncode
        or recovery.returncode
        or unfinished
        or check.returncode
        or not paid_once
    ):
        forensics.write_text(  # what a person needs to see what happened
            f"{fault}\n"
            + "\n".join(f"--- killed process stderr\n{e[-20000:]}" for e in errors)
            + f"\n--- ledger after the kill\n{after_kill}\n--- ledger at the end\n"
            + ledger_rows(engine, episode_id)
            + f"\n--- recovery\n{recovery.stdout}\n{recovery.stderr}\n"
        )
    with guard:
        result.trials += 1
        result.faults[fault] += 1
        result.paid_jobs = (result.paid_jobs or 0) + sum(jobs.values())
        result.logical_items = (result.logical_items or 0) + items
        result.stuck = (result.stuck or 0) + stuck
        result.lost += lost
        if lost:
            result.problem(f"trial {trial}: {lost} completed images missing or changed")
        if sweep.returncode != 0:
            result.problem(f"trial {trial}: sweep exit {sweep.returncode}: {sweep.stderr}")
        if recovery.returncode != 0:
            result.problem(
                f"trial {trial} ({fault}): recovery exit {recovery.returncode}: "
                f"{recovery.stderr.strip()[-300:]} (see {forensics})"
            )
        if unfinished:
            result.problem(f"trial {trial}: {unfinished} items not completed (see {forensics})")
        if not paid_once:
            result.problem(
                f"trial {trial} ({fault}): provider jobs per item {dict(jobs)} (see {forensics})"
            )
        if check.returncode != 0:
            result.problem(f"trial {trial}: check: {check.stdout.strip()[-300:]}")


def signal_some(
    processes: list[subprocess.Popen[str]], local: random.Random
) -> tuple[str, dict[int, int]]:
    """One signal (SIGKILL, SIGTERM or SIGINT) to the first process or to all of them; the
    fault's name for the report, and which processes got which signal (index -> signal)."""
    sig = local.choice(_SIGNALS)
    victims = processes if local.random() < 0.5 else processes[:1]
    hit = [victim for victim in victims if victim.poll() is None]
    for victim in hit:
        victim.send_signal(sig)
    signalled = {processes.index(victim): int(sig) for victim in hit}
    if not hit:  # counted as what it was, not as a fault injected
        return "none (the processes had finished)", signalled
    return f"{sig.name} x{len(hit)} of {len(processes)}", signalled


def in_parallel(plans: list[tuple[int, str, int]], one: Callable[[int, str, int], None]) -> None:
    """Trials three at a time (each has its own provider profile, home and episode)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        for future in [pool.submit(one, *plan) for plan in plans]:
            future.result()


def check_all(result: Result, url: str, root: Path) -> str:
    """`episodic check --all` of the scenario's database; a finding is a problem. Returns
    what the report says of it."""
    final = subprocess.run(
        [EPISODIC, "check", "--all"],
        env={**os.environ, "EPISODIC_DATABASE_URL": url, "EPISODIC_HOME": str(root)},
        capture_output=True,
        text=True,
    )
    if final.returncode != 0:
        result.problem(f"check --all: {final.stdout.strip()[-300:]}")
        return "FINDINGS"
    return "clean"


def fake_profiles(root: Path, trials: int, delay_ms: int = 300) -> Path:
    """One fake provider profile per trial (its own limit and slots)."""
    path = root / "providers.yaml"
    max_job_s = max(5, 3 * delay_ms // 1000)
    path.write_text(
        "profiles:\n"
        + "".join(
            f"  fake-t{n}:\n    kind: fake\n    cost_per_image_minor: 4\n"
            f"    max_concurrency: 3\n    delay_ms: {delay_ms}\n    max_job_s: {max_job_s}\n"
            for n in range(trials)
        )
    )
    return path


def trial_env(home: Path, url: str, profiles: Path) -> dict[str, str]:
    return {
        **os.environ,
        "EPISODIC_HOME": str(home),
        "EPISODIC_DATABASE_URL": url,
        "EPISODIC_PROVIDERS_FILE": str(profiles),
        "EPISODIC_FAKE_PROVIDER_LOG": str(home / "provider.jsonl"),
        "EPISODIC_LEASE_S": "5",
        "PYTHONFAULTHANDLER": "1",  # a hung process shows its threads when it is aborted
    }


def last_words(out: str, err: str) -> str:
    """What a `generate --json` that failed said: its JSON message, else its last line."""
    with suppress(ValueError, AttributeError, TypeError):
        return str(json.loads(out)["message"])[:300]
    lines = (err or out).strip().splitlines()
    return lines[-1][:300] if lines else "(nothing)"


def generate_trial(
    engine: Any,
    folder: Path | None,
    trial: int,
    titles: list[str],
    *,
    week: str,
    prefix: str,
    concurrency: int,
) -> Any:
    """Allocate trial `trial`'s episode of `week` (key ``{prefix}-{trial}``), record a plan of
    `titles` on profile ``{prefix}-t{trial}`` when `folder` is given, and generate it
    through the Python API at `concurrency`: the run the provider and store scenarios
    fault."""
    from episodic.core.ids import WeekId
    from episodic.core.planning import RunOptions
    from episodic.core.settings import load_settings
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate
    from tests.generation import write_playlist

    key = f"{prefix}-{trial}"
    episode_id = str(allocate(engine, PIPELINE, WeekId.parse(week), key).episode.episode_id)
    if folder is not None:
        playlist = write_playlist(folder, titles, profile=f"{prefix}-t{trial}")
        record_plan(engine, PIPELINE, episode_id, playlist)
    return generate(
        engine,
        load_settings(),
        PIPELINE,
        episode_id,
        RunOptions(concurrency=concurrency),
        EnvironmentCredentials(),
    )
