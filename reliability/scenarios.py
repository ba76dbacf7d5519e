"""The scenarios of the fault suite. Each runs real processes against a real database and
returns a `Result` whose figures were counted in that run: money from the provider's side
(the fake provider's own log, the local HTTP server's job count and bill), episodes from
the database.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, make_url, text

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


def _engine(url: str) -> Engine:
    from storage.engine import make_engine

    return make_engine(url)


# ---------------------------------------------------------------------------- allocation


def _allocate_forever(url: str, prefix: str, out: Any) -> None:  # pragma: no cover - child
    """A forked child: allocate new keys in two weeks until killed, reporting each."""
    from core.ids import WeekId
    from pipeline.allocation import allocate

    engine = _engine(url)
    weeks = [WeekId.parse("2026-W32"), WeekId.parse("2026-W33")]
    n = 0
    while True:
        key = f"{prefix}-{n}"
        episode = allocate(engine, PIPELINE, weeks[n % 2], key).episode.episode_id
        out.send((key, str(episode)))
        n += 1


def allocation_invariants(engine: Engine, result: Result, reported: list[tuple[str, str]]) -> None:
    """No key owns two episodes, sequences have no gap or duplicate, no partial episode, and
    every allocation reported to a caller (key, episode id) is in the database as reported."""
    with engine.connect() as conn:
        dupes = conn.execute(
            text(
                "SELECT allocation_key FROM episodes GROUP BY pipeline, allocation_key "
                "HAVING count(*) > 1"
            )
        ).all()
        rows = conn.execute(
            text("SELECT week_id, sequence FROM episodes ORDER BY week_id, sequence")
        ).all()
        partial = conn.execute(
            text(
                "SELECT count(*) FROM episodes e WHERE NOT EXISTS (SELECT 1 FROM "
                "episode_events v WHERE v.episode_pk = e.id AND v.kind = 'allocated')"
            )
        ).scalar_one()
    if dupes:
        result.problem(f"{len(dupes)} keys own several episodes, e.g. {dupes[0][0]}")
    weeks: dict[str, list[int]] = {}
    for week, sequence in rows:
        weeks.setdefault(week, []).append(sequence)
    for week, sequences in weeks.items():
        if sequences != list(range(len(sequences))):
            result.problem(f"{week}: sequences are not 0..{len(sequences) - 1} without gaps")
    if partial:
        result.problem(f"{partial} episodes without their allocation event (partial)")
    with engine.connect() as conn:
        stored = dict(
            conn.execute(text("SELECT allocation_key, episode_id FROM episodes")).tuples().all()
        )
    lost = [key for key, episode_id in reported if stored.get(key) != episode_id]
    result.keys = len(reported)
    result.episodes = len(reported) - len(lost)
    result.lost += len(lost)
    if lost:
        result.problem(f"{len(lost)} reported allocations are not in the database, e.g. {lost[0]}")


def alloc_crash(backend: Backend, trials: int, rng: random.Random) -> Result:
    """kill -9 / SIGTERM of an allocating process at a random moment, `trials` times: no
    partial episode, no gap or duplicate, a retry of a reported key gets its episode, and the
    next allocation proceeds within a second."""
    from core.ids import EpisodeId, WeekId
    from pipeline.allocation import allocate

    result = Result("alloc-crash", backend.name)
    url = backend.fresh()
    engine = _engine(url)
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
    allocation_invariants(engine, result, reported)
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


# ---------------------------------------------------------------------------- generation

_MARKERS = ["", "", "[[FAIL_TRANSIENT:1]]", "[[LOSE_RESPONSE]]", "[[DELAY_MS:900]]"]
_SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]


def _trial_episode(
    engine: Engine, folder: Path, trial: int, items: int, rng: random.Random
) -> tuple[str, str]:
    """An allocated, planned episode of `items` images on the trial's own provider profile
    (its own limit and slots: trials running at once do not throttle each other)."""
    from core.ids import WeekId
    from pipeline.allocation import allocate
    from pipeline.generation import record_plan
    from tests.generation import write_playlist

    profile = f"fake-t{trial}"
    episode_id = str(
        allocate(engine, PIPELINE, WeekId.parse("2026-W32"), f"gen-{trial}").episode.episode_id
    )
    titles = [f"t{trial} item {n} {rng.choice(_MARKERS)}".strip() for n in range(items)]
    record_plan(engine, PIPELINE, episode_id, write_playlist(folder, titles, profile=profile))
    return episode_id, profile


def _jobs_per_item(home: Path) -> Counter[str]:
    """Jobs per item as the fake provider holds them: one file per job it made, in its own
    state folder under `home`, mapped to items by the `submit` its log records first. Not its
    `job_created` log lines: a SIGKILL can land between a job's creation and that line (the
    fake provider runs in the killed process), and the count would miss a job that exists."""
    log, jobs = home / "provider.jsonl", home / "fake-provider"
    if not log.exists():
        return Counter()
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    item_of = {e["client_reference"]: e["item_id"] for e in events if e["event"] == "submit"}
    made = [json.loads(path.read_text())["client_reference"] for path in jobs.glob("*.json")]
    return Counter(item_of.get(reference, f"unknown:{reference}") for reference in made)


def _leftovers(
    engine: Engine, episode_id: str, *, unknown_is_stuck: bool = True
) -> tuple[int, int, int]:
    """(items not completed, runs/items/submissions left running or open, completed items
    whose image is missing or no longer matches its recorded SHA-256) of an episode. With
    `unknown_is_stuck` False, a submission left "acceptance unknown" for an operator (by
    design, for a provider that can only look jobs up) is not counted as stuck."""
    open_states = (
        "('intent', 'unknown', 'accepted')" if unknown_is_stuck else "('intent', 'accepted')"
    )
    with engine.connect() as conn:
        pk = conn.execute(
            text("SELECT id FROM episodes WHERE episode_id = :e"), {"e": episode_id}
        ).scalar_one()
        unfinished = conn.execute(
            text("SELECT count(*) FROM items WHERE episode_pk = :p AND state != 'completed'"),
            {"p": pk},
        ).scalar_one()
        stuck = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM runs WHERE episode_pk = :p AND state IN "
                "('running', 'pending')) + (SELECT count(*) FROM items WHERE episode_pk = :p "
                "AND state = 'running') + (SELECT count(*) FROM submissions s JOIN items i ON "
                f"i.id = s.item_pk WHERE i.episode_pk = :p AND s.state IN {open_states})"
            ),
            {"p": pk},
        ).scalar_one()
        outputs = conn.execute(
            text(
                "SELECT output_path, output_sha256 FROM items WHERE episode_pk = :p AND "
                "state = 'completed'"
            ),
            {"p": pk},
        ).all()
    lost = sum(1 for path, sha in outputs if _sha256(path) != sha)
    return int(unfinished), int(stuck), lost


def _sha256(path: str | None) -> str | None:
    """The file's SHA-256 (hex), or None when there is no such file."""
    import hashlib

    try:
        return hashlib.sha256(Path(path or "").read_bytes()).hexdigest()
    except OSError:
        return None


def _ledger_rows(engine: Engine, episode_id: str) -> str:
    """The episode's items and submissions, one line each (for a failed trial's forensics)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.video_id, i.state, i.attempts, i.claim_owner, i.error_text, s.attempt, "
                "s.state, s.remote_ref, s.error_text FROM items i JOIN episodes e ON e.id = "
                "i.episode_pk LEFT JOIN submissions s ON s.item_pk = i.id WHERE e.episode_id = "
                ":e ORDER BY i.video_id, s.attempt"
            ),
            {"e": episode_id},
        ).all()
        runs = conn.execute(
            text(
                "SELECT r.id, r.state, r.error_text FROM runs r JOIN episodes e ON e.id = "
                "r.episode_pk WHERE e.episode_id = :e"
            ),
            {"e": episode_id},
        ).all()
    return "\n".join(str(tuple(r)) for r in [*runs, *rows])


def _recover_and_check(
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
            # PYTHONFAULTHANDLER (see _trial_env): SIGABRT prints every thread's stack first
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
    after_kill = _ledger_rows(engine, episode_id)
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
                said = _said(out, err) or "(nothing)"
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
    jobs = _jobs_per_item(home)
    unfinished, stuck, lost = _leftovers(engine, episode_id)
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
            + _ledger_rows(engine, episode_id)
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


def _signal_some(
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


def _in_parallel(plans: list[tuple[int, str, int]], one: Callable[[int, str, int], None]) -> None:
    """Trials three at a time (each has its own provider profile, home and episode)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        for future in [pool.submit(one, *plan) for plan in plans]:
            future.result()


def generate_crash(backend: Backend, trials: int, rng: random.Random) -> Result:
    """`episodic generate` killed (SIGKILL, SIGTERM or SIGINT) at a random moment, one or two
    processes on one episode, against the fake provider with latency, transient failures and
    lost replies; then the sweep and the one recovery command (`episodic generate EPISODE`,
    which also covers a process killed before it made its run): every item
    completed, one provider job per item, nothing stuck, `check` clean."""
    result = Result("generate-crash", backend.name)
    url = backend.fresh()
    engine = _engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-gen-"))
    profiles = _profiles(root, trials)
    items = 6
    guard = threading.Lock()
    plans = []
    for trial in range(trials):
        seed = rng.randrange(2**32)
        episode_id, _ = _trial_episode(engine, root / f"pl{trial}", trial, items, rng)
        plans.append((trial, episode_id, seed))

    def one(trial: int, episode_id: str, seed: int) -> None:
        local = random.Random(seed)
        home = root / f"home{trial}"
        home.mkdir(parents=True, exist_ok=True)
        env = _trial_env(home, url, profiles)
        together = 2 if local.random() < 0.4 else 1
        command = [EPISODIC, "generate", episode_id, "--json", "--concurrency", "3"]
        processes = [
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(together)
        ]
        time.sleep(local.uniform(0.3, 2.0))  # a run of 6 items lasts about 2-3 s here
        fault, signalled = _signal_some(processes, local)
        _recover_and_check(
            result, guard, engine, env, episode_id, items, home, trial, processes, fault,
            signalled=signalled, cli=True,
        )  # fmt: skip

    _in_parallel(plans, one)
    clean = _check_all(result, url, root)
    result.notes = (
        f"{items} items per episode, fake provider 300 ms per job, a third of the prompts with "
        "a transient failure, a lost reply or a 0.9 s job; recovery: `episodic sweep`, then "
        f"`episodic generate EPISODE`; `check --all` at the end: {clean}"
    )
    engine.dispose()
    return result


_FLOW = (
    "from flows.generate import generate_episode\n"
    "generate_episode(episode_id={episode!r}, concurrency=3)\n"
)


def flow_crash(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Prefect flow-run processes (`generate_episode` against a real `prefect server`), one
    or two on one episode, killed with SIGKILL, SIGTERM or SIGINT at a random moment, against
    the fake provider with latency, transient failures and lost replies; then the sweep and
    the one recovery command: every item completed, one provider job per item, nothing stuck,
    `check` clean."""
    from tests.e2e.stack import PrefectServer

    result = Result("flow-crash", backend.name)
    url = backend.fresh()
    engine = _engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-flow-"))
    profiles = _profiles(root, trials)
    items = 6
    guard = threading.Lock()
    plans = []
    for trial in range(trials):
        seed = rng.randrange(2**32)
        episode_id, _ = _trial_episode(engine, root / f"pl{trial}", trial, items, rng)
        plans.append((trial, episode_id, seed))
    server = PrefectServer(tmp_dir=root / "prefect", ui=False).start()

    def one(trial: int, episode_id: str, seed: int) -> None:
        local = random.Random(seed)
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = server.env(_trial_env(home, url, profiles))
        together = 2 if local.random() < 0.3 else 1
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", _FLOW.format(episode=episode_id)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(together)
        ]
        time.sleep(local.uniform(1.0, 4.0))  # a flow run starts in about 2 s, lasts 1-2 s more
        fault, signalled = _signal_some(processes, local)
        _recover_and_check(
            result, guard, engine, env, episode_id, items, home, trial, processes, fault,
            signalled=signalled, cli=False,
        )  # fmt: skip

    try:
        _in_parallel(plans, one)
    finally:
        server.stop()
    clean = _check_all(result, url, root)
    result.notes = (
        f"{items} items per episode, the flow on the thread runner with concurrency 3, fake "
        "provider 300 ms per job with the same markers as generate-crash, two flow runs on "
        "one episode in about a third of the trials; recovery: `episodic sweep`, then "
        "`episodic generate EPISODE` (the CLI finishes what the flow started); `check --all` "
        f"at the end: {clean}"
    )
    engine.dispose()
    return result


def _check_all(result: Result, url: str, root: Path) -> str:
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


def _profiles(root: Path, trials: int, delay_ms: int = 300) -> Path:
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


def _trial_env(home: Path, url: str, profiles: Path) -> dict[str, str]:
    return {
        **os.environ,
        "EPISODIC_HOME": str(home),
        "EPISODIC_DATABASE_URL": url,
        "EPISODIC_PROVIDERS_FILE": str(profiles),
        "EPISODIC_FAKE_PROVIDER_LOG": str(home / "provider.jsonl"),
        "EPISODIC_LEASE_S": "5",
        "PYTHONFAULTHANDLER": "1",  # a hung process shows its threads when it is aborted
    }


# ---------------------------------------------------------------------------- provider

_FAULTS = [
    "[[CREATED_502]]",
    "[[CREATED_504]]",
    "[[CREATED_409]]",
    "[[CREATED_422_IDEMPOTENCY]]",
    "[[MALFORMED_CREATE]]",
    "[[ACCEPT_DROP]]",
    "[[SLOW_MS:1200]]",
    "[[HTTP_429:2]]",
    "[[HTTP_500]]",
    "[[POLL_QUEUED:3]]",
    "[[POLL_401]]",
    "[[POLL_500:2]]",
    "[[POLL_BADJSON]]",
    "[[DOWNLOAD_404:2]]",
]


def provider_faults(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Runs against the local HTTP provider server with every fault mode mixed at random
    (several per item), a provider that honours idempotency keys or only lookups, a list
    that ignores its filter in some runs: one job per item, and the ledger's cost equals the
    server's bill."""
    from tests.http_server import TOKEN, PredictionsServer

    result = Result("provider-faults", backend.name)
    url = backend.fresh()
    engine = _engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-http-"))
    saved = {k: os.environ.get(k) for k in ("EPISODIC_PROVIDERS_FILE", "TEST_IMAGE_TOKEN")}
    os.environ["TEST_IMAGE_TOKEN"] = TOKEN
    paid = items_total = operator = made_anyway = 0
    try:
        for trial in range(trials):
            honour = rng.random() < 0.5
            ignores_filter = rng.random() < 0.25
            with PredictionsServer(
                honour_idempotency=honour, list_ignores_filter=ignores_filter
            ) as server:
                profiles = root / f"providers{trial}.yaml"
                profiles.write_text(
                    f"profiles:\n  http-t{trial}:\n    kind: http\n"
                    f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
                    "    cost_per_image_minor: 5\n    max_concurrency: 4\n    timeout_s: 1\n"
                    f"    poll_interval_s: 0.05\n    idempotent_create: {str(honour).lower()}\n"
                    "    lookup: true\n"
                )
                os.environ["EPISODIC_PROVIDERS_FILE"] = str(profiles)
                count = rng.randint(3, 6)
                titles = []
                for n in range(count):
                    faults = rng.sample(_FAULTS, rng.randint(0, 2))
                    result.faults.update(f.strip("[]").split(":")[0] for f in faults)
                    titles.append(f"t{trial} i{n} {' '.join(faults)}".strip())
                outcome = _generate_http(engine, root / f"pl{trial}", trial, titles)
                if outcome.state.value != "completed":  # a resume settles what is left
                    outcome = _generate_http(engine, None, trial, titles)
                made = server.jobs_made
                paid += sum(made.values())
                items_total += count
                result.trials += 1
                left = _unfinished(engine, f"http-{trial}")
                # an Idempotency-Key is {installation}-{item key}-{attempt}
                per_item = Counter(key.rsplit("-", 2)[-2] for key in made.elements())
                for prompt, error, key in left:
                    if not honour and (error or "").startswith("acceptance unknown"):
                        operator += 1  # as designed: a lookup that finds nothing proves nothing
                        made_anyway += 1 if per_item.get(key) else 0
                    else:
                        result.problem(f"run {trial}: {prompt!r} not completed: {error}")
                _, stuck, lost = _leftovers(
                    engine, _episode_of(engine, f"http-{trial}"), unknown_is_stuck=honour
                )
                result.stuck = (result.stuck or 0) + stuck
                result.lost += lost
                if any(n > 1 for n in per_item.values()):  # per item: any attempt, any key
                    result.problem(f"run {trial}: a second job was made: {dict(made)}")
                if len(made) < count - len(left):
                    result.problem(f"run {trial}: a completed item has no job of its own")
                cost = _episode_cost(engine, f"http-{trial}")
                if cost != server.bill_minor:
                    result.problem(
                        f"run {trial}: ledger {cost} != provider bill {server.bill_minor}"
                    )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result.paid_jobs, result.logical_items = paid, items_total
    result.notes = (
        "3-6 items per run, 0-2 fault modes per item; idempotent create or lookup only at "
        "random; a quarter of the runs with a list that ignores its filter; each run resumed "
        f"once if it did not complete. {operator} items were left 'acceptance unknown' for an "
        "operator, as designed: their provider offers no idempotent create and its lookup "
        "found no job, which does not prove that none was made (the server had made a job "
        f"for {made_anyway} of them: an operator's --force-resubmit would pay those twice)"
    )
    engine.dispose()
    return result


def _generate_http(engine: Engine, folder: Path | None, trial: int, titles: list[str]) -> Any:
    from core.ids import WeekId
    from core.planning import RunOptions
    from core.settings import load_settings
    from pipeline.allocation import allocate
    from pipeline.gate import EnvironmentCredentials
    from pipeline.generation import generate, record_plan
    from tests.generation import write_playlist

    episode_id = str(
        allocate(engine, PIPELINE, WeekId.parse("2026-W32"), f"http-{trial}").episode.episode_id
    )
    if folder is not None:
        playlist = write_playlist(folder, titles, profile=f"http-t{trial}")
        record_plan(engine, PIPELINE, episode_id, playlist)
    return generate(
        engine,
        load_settings(),
        PIPELINE,
        episode_id,
        RunOptions(concurrency=4),
        EnvironmentCredentials(),
    )


def _unfinished(engine: Engine, key: str) -> list[tuple[str, str | None, str]]:
    """(prompt, error, item key) of the items of the episode of allocation key `key` not
    completed."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.prompt, i.error_text, i.idempotency_key FROM items i JOIN episodes e "
                "ON e.id = i.episode_pk WHERE e.allocation_key = :k AND i.state != 'completed'"
            ),
            {"k": key},
        ).all()
    return [(str(prompt), error, str(item_key)) for prompt, error, item_key in rows]


def _episode_of(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT episode_id FROM episodes WHERE allocation_key = :k"), {"k": key}
            ).scalar_one()
        )


def _episode_cost(engine: Engine, key: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(c.amount_minor), 0) FROM cost_entries c JOIN episodes e "
                    "ON e.id = c.episode_pk WHERE e.allocation_key = :k"
                ),
                {"k": key},
            ).scalar_one()
        )


# ---------------------------------------------------------------------------- database


def _allocate_through_faults(url: str, prefix: str, out: Any) -> None:  # pragma: no cover
    """A forked child: allocate new keys until killed, reporting each allocation, and each
    error that survived the callers' own retries (tenacity) as ("error", text)."""
    from core.ids import WeekId
    from pipeline.allocation import allocate

    engine = _engine(url)
    week = WeekId.parse("2026-W40")
    n = 0
    while True:
        key = f"{prefix}-{n}"
        try:
            out.send((key, str(allocate(engine, PIPELINE, week, key).episode.episode_id)))
            n += 1
        except Exception as exc:  # given up after its retries: the caller sees an error
            out.send(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            time.sleep(0.05)


def pg_terminate(backend: Backend, trials: int, rng: random.Random) -> Result:
    """PostgreSQL connections killed with `pg_terminate_backend` (every 0.1-0.4 s, for 8 s)
    while 8 processes allocate and a generation runs: callers retry transient errors
    (tenacity), every allocation reported is in the database once, sequences have no gap or
    duplicate, and after the one recovery command the batch is complete, one provider job per
    item, no run left running."""
    url = backend.fresh()
    database = make_url(url).database

    def terminate(until: float, result: Result) -> None:
        with _engine(url).connect() as admin:
            while time.monotonic() < until:
                time.sleep(rng.uniform(0.1, 0.4))
                result.faults["connections terminated"] += len(
                    admin.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "datname = :d AND pid <> pg_backend_pid()"
                        ),
                        {"d": database},
                    ).all()
                )
                admin.commit()

    return _under_database_faults(
        Result("pg-terminate", backend.name), url, trials, rng, terminate, 8.0,
        "a generation under pg_terminate_backend",
    )  # fmt: skip


def pg_restart(backend: Backend, trials: int, rng: random.Random) -> Result:
    """The PostgreSQL server itself restarted (a private cluster made for the scenario: 3
    restarts per trial, each a clean `fast` shutdown or an `immediate` one, a crash that
    recovers from WAL, down 0-2 s) while 8 processes allocate and a generation runs: callers
    retry transient errors (tenacity) through the outage, every allocation reported is in the
    database once, sequences have no gap or duplicate, and after the one recovery command the
    batch is complete, one provider job per item, no run left running."""
    from tests.pgcluster import PrivateCluster

    with PrivateCluster() as cluster:
        url = cluster.create_database("episodic_restart")

        def restart(until: float, result: Result) -> None:
            for _ in range(3):
                time.sleep(rng.uniform(0.5, 2.5))
                mode = rng.choice(["fast", "immediate"])
                cluster.restart(mode, rng.uniform(0.0, 2.0))
                result.faults[f"restarts ({mode})"] += 1
            time.sleep(max(0.0, until - time.monotonic()))

        return _under_database_faults(
            Result("pg-restart", backend.name), url, trials, rng, restart, 12.0,
            "a generation across PostgreSQL restarts",
        )  # fmt: skip


def _under_database_faults(
    result: Result,
    url: str,
    trials: int,
    rng: random.Random,
    inject: Callable[[float, Result], None],
    seconds: float,
    fault: str,
) -> Result:
    """8 allocating processes and an `episodic generate` of a 6-item episode per trial, while
    `inject(until, result)` breaks the database until `until`; then the sweep, the recovery
    command and the checks of every allocation reported."""
    engine = _engine(url)
    root = Path(tempfile.mkdtemp(prefix=f"episodic-reliability-{result.scenario}-"))
    profiles = _profiles(root, trials, delay_ms=2000)  # the generation lives through the faults
    context = multiprocessing.get_context("fork")
    reported: list[tuple[str, str]] = []
    gave_up: list[str] = []
    broken: list[str] = []
    for trial in range(trials):
        episode_id, _ = _trial_episode(engine, root / f"pl{trial}", trial, 6, rng)
        engine.dispose()  # no pooled connection crosses the fork below
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = _trial_env(home, url, profiles)
        pipes, children = [], []
        for n in range(8):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(
                target=_allocate_through_faults, args=(url, f"t{trial}p{n}", send), daemon=True
            )
            child.start()
            send.close()
            pipes.append(receive)
            children.append(child)
        batch = subprocess.Popen(
            [EPISODIC, "generate", episode_id, "--json", "--concurrency", "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        inject(time.monotonic() + seconds, result)
        time.sleep(1.0)  # the last outage's retries finish and report
        with suppress(subprocess.TimeoutExpired):
            out, err = batch.communicate(timeout=60)
            if batch.returncode != 0:  # the docs promise a batch rides the faults out
                said = _said(out, err)
                broken.append(said)
                result.problem(
                    f"trial {trial}: the generation under the faults ended with exit "
                    f"{batch.returncode}: {said}"
                )
        for child in children:
            os.kill(child.pid or 0, signal.SIGKILL)
            child.join(30)
        for receive in pipes:
            with suppress(EOFError, OSError):
                while receive.poll():
                    key, answer = receive.recv()
                    if key == "error":
                        gave_up.append(answer)
                    else:
                        reported.append((key, answer))
        engine.dispose()  # the suite's own pooled connections were broken too
        result.faults["allocating processes"] += 8
        _recover_and_check(
            result, threading.Lock(), engine, env, episode_id, 6, home, trial, [batch], fault
        )
    allocation_invariants(engine, result, reported)
    if gave_up:
        result.problem(f"{len(gave_up)} allocations failed after retries, e.g. {gave_up[0]}")
    result.notes = (
        f"{len(reported)} allocations reported under the faults; "
        f"{len(gave_up)} surfaced an error after the callers' retries; {len(broken)} of "
        f"{trials} generations ended with an error under the faults"
        + "".join(f"; one said: {line}" for line in sorted(set(broken)))
    )
    engine.dispose()
    return result


def _said(out: str, err: str) -> str:
    """What a `generate --json` that failed said: its JSON message, else its last line."""
    with suppress(ValueError, AttributeError, TypeError):
        return str(json.loads(out)["message"])[:300]
    lines = (err or out).strip().splitlines()
    return lines[-1][:300] if lines else "(nothing)"


_HOLD_THE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # held until the suite closes our stdin: past every blocked command
conn.execute("ROLLBACK")
"""


def sqlite_locked(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Another process holds SQLite's write lock until `episodic allocate` and `episodic
    generate`, started meanwhile, have given up after the busy timeout (30 s): each ends with
    one clear line (exit 1, "database is locked"), `PRAGMA integrity_check` is ok, nothing is
    half-written, and both succeed once the lock is gone."""
    from storage.engine import SQLITE_BUSY_TIMEOUT_MS

    result = Result("sqlite-locked", backend.name)
    url = backend.fresh()
    engine = _engine(url)
    path = url.removeprefix("sqlite:///")
    reported: list[tuple[str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-locked-"))
    profiles = _profiles(root, trials)
    wait_s = SQLITE_BUSY_TIMEOUT_MS / 1000
    for trial in range(trials):
        episode_id, _ = _trial_episode(engine, root / f"pl{trial}", trial, 3, rng)
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = _trial_env(home, url, profiles)
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_THE_LOCK, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        result.faults["write lock held past the busy timeout"] += 1
        commands = {
            "allocate": [EPISODIC, "allocate", "--key", f"locked-{trial}", "--week", "2026-W41"],
            "generate": [EPISODIC, "generate", episode_id, "--json"],
        }
        blocked = {
            name: subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for name, command in commands.items()
        }
        for name, process in blocked.items():
            _, err = process.communicate(timeout=wait_s + 120)
            lines = err.strip().splitlines()
            clear = process.returncode == 1 and len(lines) == 1 and "locked" in lines[0]
            if not clear:
                result.problem(
                    f"trial {trial}: {name} under a held lock: exit "
                    f"{process.returncode}, {err.strip()[-300:]!r}"
                )
        assert holder.stdin is not None
        holder.stdin.close()  # the lock is released only now
        holder.wait(timeout=60)
        with engine.connect() as conn:
            integrity = conn.execute(text("PRAGMA integrity_check")).scalar_one()
        if integrity != "ok":
            result.problem(f"trial {trial}: integrity_check: {integrity}")
        after = subprocess.run(
            [EPISODIC, "allocate", "--key", f"locked-{trial}", "--week", "2026-W41"],
            env=env,
            capture_output=True,
            text=True,
        )
        if after.returncode != 0:
            result.problem(f"trial {trial}: allocate after the lock: {after.stderr.strip()}")
        else:
            reported.append((f"locked-{trial}", after.stdout.split()[0]))
        _recover_and_check(
            result, threading.Lock(), engine, env, episode_id, 3, home, trial, [],
            "a generation after the lock",
        )  # fmt: skip
    allocation_invariants(engine, result, reported)
    result.notes = f"the busy timeout is {SQLITE_BUSY_TIMEOUT_MS / 1000:.0f} s"
    engine.dispose()
    return result


SCENARIOS: dict[str, Callable[[Backend, int, random.Random], Result]] = {
    "alloc-crash": alloc_crash,
    "generate-crash": generate_crash,
    "flow-crash": flow_crash,
    "provider-faults": provider_faults,
    "pg-terminate": pg_terminate,
    "pg-restart": pg_restart,
    "sqlite-locked": sqlite_locked,
}
ONLY_ON = {"pg-terminate": "postgres", "pg-restart": "postgres", "sqlite-locked": "sqlite"}
TRIALS = {
    "alloc-crash": 200,
    "generate-crash": 55,  # a few trials end before their signal (counted as "none")
    "flow-crash": 55,
    "provider-faults": 50,
    "pg-terminate": 3,
    "pg-restart": 3,
    "sqlite-locked": 2,
}
