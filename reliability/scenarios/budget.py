"""Budget storms: providers whose replies bill above the price's estimate, against a weekly
budget or a run's cap, and generates killed or stopped with jobs at the provider under an
exhausted budget, then resumed; with real `episodic generate` processes, the provider's own
bill is held against the limit."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import text

from reliability.harness import PIPELINE, Backend, Result, open_engine

# (the server's billing, the profile's price, the estimate, what each call is billed)
BILLINGS = {
    "per_image 0.08 reported vs 0.05": ("http", '{per_image: "0.05"}', 50_000, 80_000),
    "per_second 4.5 s vs at_most 4": (
        "per_second",
        '{per_second: "0.01", at_most: "4"}',
        40_000,
        45_000,
    ),
    "per_megapixel 2000x1000 vs at_most 1": (
        "per_megapixel",
        '{per_megapixel: "0.02", at_most: "1"}',
        20_000,
        40_000,
    ),
}
MODES = ("8 concurrent generates", "3 runs one after another", "a run's --max-cost")


def budget_storm(backend: Backend, trials: int, rng: random.Random) -> Result:
    """A provider that bills every call above the price's estimate (a per-image reply that
    reports 0.08 for a 0.05 price; a predict_time above `at_most`; a 2000x1000 image under
    `at_most: "1"`), each trial on a fresh database and a price never billed before, in one
    of three storms: eight `episodic generate` processes released together by a barrier
    under a weekly budget, three runs one after another under a weekly budget that holds two
    real charges and an estimate, or one run with `--max-cost` and concurrency 2-4: the
    provider's own bill never passes the budget or the cap, the ledger equals the bill,
    every process ends 0, 2 or 7, and no submission is left open."""
    from tests.http_server import TOKEN as HTTP_TOKEN
    from tests.http_server import PredictionsServer
    from tests.jobs_servers import TOKEN, ReplicateServer

    result = Result("budget-storm", backend.name)
    jobs = 0
    worst = ""
    for trial in range(trials):
        label = rng.choice(sorted(BILLINGS))
        mode = rng.choice(MODES)
        result.faults[mode] += 1
        kind, price, estimate, charge = BILLINGS[label]
        server: Any
        if kind == "http":
            server = PredictionsServer(price_micros=charge, report_cost=True)
        elif kind == "per_second":
            server = ReplicateServer(billing="per_second", price_micros=10_000, compute_s=4.5)
        else:
            size = (2000, 1000)
            server = ReplicateServer(billing="per_megapixel", price_micros=20_000, size=size)
        root = Path(tempfile.mkdtemp(prefix="episodic-reliability-budget-"))
        url = backend.fresh()
        engine = open_engine(url)
        with server:
            env = _env(root, url, _profiles(root, server, kind, price))
            env.update(IMAGE_KEY=TOKEN, TEST_IMAGE_TOKEN=HTTP_TOKEN)
            if mode == MODES[0]:
                limit = rng.randint(5, 12) * 100_000
                episodes = _episodes(engine, root, 8, 3)
                _episodic(env, "pipelines", "set-budget", PIPELINE, _money(limit), "--per", "week")
                codes = _together(env, [["generate", e, "--concurrency", "3"] for e in episodes])
            elif mode == MODES[1]:
                limit = 2 * charge + estimate + rng.randint(0, charge - 1)
                episodes = _episodes(engine, root, 3, 1)
                _episodic(env, "pipelines", "set-budget", PIPELINE, _money(limit), "--per", "week")
                codes = [_episodic(env, "generate", e).returncode for e in episodes]
            else:
                items = rng.randint(3, 6)
                limit = items * estimate + rng.randint(0, estimate)
                (episode,) = _episodes(engine, root, 1, items)
                concurrency = str(rng.randint(2, 4))
                codes = [
                    _episodic(
                        env,
                        "generate",
                        episode,
                        "--max-cost",
                        _money(limit),
                        "--concurrency",
                        concurrency,
                    ).returncode
                ]
            bill = server.bill_micros
            jobs += len(server.jobs)
        ledger, stuck = _ledger_and_open(engine)
        engine.dispose()
        result.trials += 1
        result.stuck = (result.stuck or 0) + stuck
        where = f"trial {trial} ({mode}, {label})"
        if bill > limit:
            result.problem(f"{where}: the provider billed {bill}, above the limit {limit}")
        if ledger != bill:
            result.problem(f"{where}: ledger {ledger} != provider bill {bill}")
        if any(code not in (0, 2, 7) for code in codes):
            result.problem(f"{where}: exit codes {codes}")
        if not worst or bill * 1_000 // max(limit, 1) > int(worst.split("/")[0]):
            worst = f"{bill * 1_000 // max(limit, 1)}/1000 ({_money(bill)} of {_money(limit)})"
    result.paid_jobs = jobs
    result.notes = (
        f"{jobs} provider jobs in all; the closest a bill came to its limit: {worst} of it; "
        "each trial a fresh database, so its first call is a price never billed (probed)"
    )
    return result


KILL_PRICE_MICROS = 100_000
KILL_SIGNALS = (signal.SIGKILL, signal.SIGTERM)
# what a generate may end with: 0 done, 2 refused at the budget guard, 7 budget reached;
# signalled, also the signal's own status, or 130 for SIGTERM (docs/cli.md)
GENERATE_CODES = {0, 2, 7}
RESUME_CODES = {0, 7}


def budget_kill_storm(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Eight `episodic generate` processes of three images each started together against the
    fake provider (0.10 an image, each job 0.8-2 s at the provider) under a weekly budget of
    0.80-2.00 that cannot hold them all (2.40), each trial on a fresh database and a price
    never billed before; one or two of them get one signal, SIGKILL or SIGTERM at random,
    at a random moment while a job of theirs is accepted at the provider and not collected.
    Then one `runs resume` of each run, the signalled first (their leases still live): the
    provider's own bill (its job store, which a kill cannot hide) never passes the budget,
    the ledger equals the bill, no item is paid twice, no submission is left open, `check
    --all` reports no job never collected, a resume stopped at the budget does not claim
    what it did not collect, and every process ends with a documented exit code."""
    from tests.generation import made_jobs_per_key

    result = Result("budget-kill-storm", backend.name)
    jobs = 0
    worst = ""
    for trial in range(trials):
        sig = rng.choice(KILL_SIGNALS)
        victims = rng.randint(1, 2)
        delay_ms = rng.randint(800, 2000)
        limit = rng.randint(8, 20) * 100_000
        root = Path(tempfile.mkdtemp(prefix="episodic-reliability-kill-"))
        url = backend.fresh()
        engine = open_engine(url)
        profiles = root / "providers.yaml"
        profiles.write_text(
            'profiles:\n  paid:\n    kind: fake\n    price: {per_image: "0.10"}\n'
            f"    max_concurrency: 64\n    delay_ms: {delay_ms}\n"
        )
        env = _env(root, url, profiles)
        env.update(
            EPISODIC_FAKE_PROVIDER_LOG=str(root / "provider.jsonl"),
            EPISODIC_LEASE_S="5",
            PYTHONFAULTHANDLER="1",
        )
        where = f"trial {trial} ({sig.name}, {victims} signalled, budget {_money(limit)})"
        episodes = _episodes(engine, root, 8, 3)
        _episodic(env, "pipelines", "set-budget", PIPELINE, _money(limit), "--per", "week")
        pause = partial(rng.uniform, 0, delay_ms / 1000)
        hit = _kill_storm(result, where, env, episodes, sig, victims, pause)
        # a process that ended before its moment came is not counted as a fault injected
        result.faults[f"{sig.name} x{hit} of 8" if hit else "none (no job left to signal in)"] += 1
        made = made_jobs_per_key(root / "home")
        bill = sum(made.values()) * KILL_PRICE_MICROS
        jobs += sum(made.values())
        check = _episodic(env, "check", "--all")
        ledger, stuck = _ledger_and_open(engine)
        engine.dispose()
        result.trials += 1
        result.stuck = (result.stuck or 0) + stuck
        if stuck:
            result.problem(f"{where}: {stuck} submissions left open after the resumes")
        if bill > limit:
            result.problem(f"{where}: the provider billed {bill}, above the budget {limit}")
        if ledger != bill:
            result.problem(f"{where}: ledger {ledger} != provider bill {bill}")
        if any(n > 1 for n in made.values()):
            result.problem(f"{where}: items paid twice at the provider: {dict(made)}")
        if "never collected" in check.stdout:
            result.problem(f"{where}: check --all: {check.stdout.strip()[-300:]}")
        if not worst or bill * 1_000 // limit > int(worst.split("/")[0]):
            worst = f"{bill * 1_000 // limit}/1000 ({_money(bill)} of {_money(limit)})"
    result.paid_jobs = jobs
    result.notes = (
        f"{jobs} provider jobs in all; the closest a bill came to its budget: {worst} of it; "
        "recovery: one `episodic runs resume RUN` of each run, the signalled first"
    )
    return result


def _kill_storm(
    result: Result,
    where: str,
    env: dict[str, str],
    episodes: list[str],
    sig: signal.Signals,
    victims: int,
    pause: Callable[[], float],
) -> int:
    """The storm (`tests.generation.signal_storm`: each victim signalled `pause()` seconds
    after it is seen with a job at the provider) and one resume of each run; a problem for
    each exit code outside the documented ones (docs/cli.md), or a traceback. Returns how
    many processes were signalled."""
    import json

    from tests.generation import signal_storm

    storm = signal_storm(
        episodes,
        sig,
        env=env,
        victims=victims,
        pause=pause,
        required=False,
    )
    for episode, hit, code, err in storm:
        allowed = GENERATE_CODES
        if hit:  # the signal's own status; SIGTERM is handled: 130 (interrupted, paused)
            allowed = allowed | {-int(sig)} | ({130} if sig == signal.SIGTERM else set())
        if code not in allowed or "Traceback" in err:
            result.problem(f"{where}: generate {episode} exit {code}: {err.strip()[-300:]}")
    for episode, *_ in storm:
        listed = _episodic(env, "runs", "list", "--episode", episode, "--json")
        for run in json.loads(listed.stdout or "[]"):
            resumed = _episodic(env, "runs", "resume", run["run_id"], "--json")
            if resumed.returncode not in RESUME_CODES or "Traceback" in resumed.stderr:
                result.problem(
                    f"{where}: runs resume exit {resumed.returncode}: "
                    f"{resumed.stderr.strip()[-300:]}"
                )
            elif resumed.returncode == 7:
                message = str(json.loads(resumed.stdout)["message"])
                if (
                    "budget reached" not in message
                    or "not collected" in message
                    or ("calls in flight were collected" in message)
                ):
                    result.problem(f"{where}: a resume stopped at the budget said: {message}")
    return sum(1 for _episode, hit, _code, _err in storm if hit)


def _ledger_and_open(engine: Any) -> tuple[int, int]:
    """What the ledger records as paid (micro-units), and how many submissions are still
    open (intent, accepted, unknown): the two figures every trial holds against the bill."""
    with engine.connect() as conn:
        ledger = int(
            conn.execute(
                text("SELECT COALESCE(SUM(amount_micros), 0) FROM cost_entries")
            ).scalar_one()
        )
        stuck = int(
            conn.execute(
                text(
                    "SELECT count(*) FROM submissions WHERE state IN "
                    "('intent', 'accepted', 'unknown')"
                )
            ).scalar_one()
        )
    return ledger, stuck


def _money(micros: int) -> str:
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def _profiles(root: Path, server: Any, kind: str, price: str) -> Path:
    if kind == "http":
        fields = "    kind: http\n    credential_env: TEST_IMAGE_TOKEN\n"
    else:
        fields = (
            "    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
            "    credential_env: IMAGE_KEY\n"
        )
    path = root / "providers.yaml"
    path.write_text(
        f"profiles:\n  paid:\n{fields}    base_url: {server.base_url}\n    price: {price}\n"
        "    timeout_s: 5.0\n    poll_interval_s: 0.02\n    max_concurrency: 64\n"
    )
    return path


def _env(root: Path, url: str, profiles: Path) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "EPISODIC_HOME": str(root / "home"),
        "EPISODIC_DATABASE_URL": url,
        "EPISODIC_PROVIDERS_FILE": str(profiles),
    }


def _episodes(engine: Any, root: Path, count: int, items: int) -> list[str]:
    """`count` planned episodes of `items` items each on profile ``paid`` (the plan reads
    the trial's providers file)."""
    import os

    saved = os.environ.get("EPISODIC_PROVIDERS_FILE")
    os.environ["EPISODIC_PROVIDERS_FILE"] = str(root / "providers.yaml")
    try:
        return _planned(engine, root, count, items)
    finally:
        if saved is None:
            os.environ.pop("EPISODIC_PROVIDERS_FILE", None)
        else:
            os.environ["EPISODIC_PROVIDERS_FILE"] = saved


def _planned(engine: Any, root: Path, count: int, items: int) -> list[str]:
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from tests.generation import write_playlist

    ids = []
    for n in range(count):
        episode = allocate(engine, PIPELINE, WeekId.parse("2026-W32"), f"storm-{n}").episode
        titles = [f"e{n} i{i}" for i in range(items)]
        playlist = write_playlist(root / f"pl{n}", titles, profile="paid")
        record_plan(engine, PIPELINE, str(episode.episode_id), playlist)
        ids.append(str(episode.episode_id))
    return ids


def _episodic(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "episodic"), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _together(env: dict[str, str], commands: list[list[str]]) -> list[int]:
    """Each of `commands` as its own process, released together by a barrier."""
    from tests.integration import budget_workers as bw
    from tests.integration import race_workers as w

    results = w.run_processes([(bw.cli_worker, (args, env)) for args in commands])
    return [code for _args, code, _out, _err in results]
