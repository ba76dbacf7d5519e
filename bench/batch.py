"""Batch benchmark for paid generation: each figure beside a baseline of its run.

(a) makespan of 200 items at 200 ms (and 2 s) fake latency, concurrency 8 and 32:
    - the CLI (`episodic generate` in a subprocess; the run's makespan from the ledger)
      against the ideal (target <= 1.10x); and, unless --skip-s3, the same command with the
      media store in a bucket of a moto S3 server on loopback (`tests/s3_server.py`, a
      process of its own, nothing leaves the machine) against the local folder, side by
      side in each round (target <= 1.10x);
    - two floors, measured in the same run on the same `ThreadPoolTaskRunner` and the same
      ephemeral server: the sleeping floor (plain tasks sleeping the latency) and the
      same-work floor, the flow a user would otherwise write (bare Prefect tasks that call
      the same fake provider, which simulates the server side: job files and the PNG render,
      and store the same images in a local folder through the same media store; Prefect's
      own result caching, no ledger, no claims);
    - the `generate_episode` flow against each floor (target <= 1.15x the same-work floor).
    The flow runs on the embedded SQLite database and, unless --skip-postgres, on Postgres
    too. The ideal is what a perfect scheduler achieves with items of a fixed latency: they
    run in waves of `concurrency`, so ceil(items / concurrency) x latency (200 items at 32
    make 7 waves, 1.40 s; items / concurrency x latency, 1.25 s, cannot be reached). Items
    under a second run --rounds rounds (3) of each side, one after the other; each ratio is
    the median of the rounds' ratios, with their range, and each side prints its rounds.
(b) bookkeeping: see bench/ledger.py (the per-item ledger against raw SQL issuing the same
    commits, on both backends).
(c) planning a resume of 100,000 items of which 99% are complete. Target < 1 s on each backend.

Run: make bench  (or .venv/bin/python -m bench.batch [--skip-postgres] [--skip-s3] [--skip-flow]
[--rounds N] [--prefect-heartbeats] [--makespan ITEMS:MS:CONCURRENCY])
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.batch_scripts import FLOOR, FLOW, SAME_WORK

ROOT = Path(__file__).resolve().parent.parent
S3 = tuple[Any, str] | None  # a running tests.s3_server.S3Server and a bucket on it


def _env(home: Path, url: str | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "EPISODIC_HOME": str(home), **extra}
    env.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
    if url:
        env["EPISODIC_DATABASE_URL"] = url
    return env


def _playlist(folder: Path, videos: int) -> Path:
    from tests.generation import write_playlist

    return write_playlist(folder, [f"video {n}" for n in range(1, videos + 1)])


def _setup_episode(url: str, folder: Path, videos: int) -> str:
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from episodic.storage.engine import make_engine
    from episodic.storage.schema import upgrade

    engine = make_engine(url)
    upgrade(engine)
    episode = str(
        allocate(
            engine, "weekly", WeekId.parse("2026-W32"), f"bench-{folder.name}"
        ).episode.episode_id
    )
    record_plan(engine, "weekly", episode, _playlist(folder, videos))
    engine.dispose()
    return episode


def _run_makespan(url: str) -> float:
    from episodic.storage.engine import make_engine
    from episodic.storage.runs import RunStore

    engine = make_engine(url)
    (run,) = RunStore(engine).list_runs("weekly")
    engine.dispose()
    assert run.state == "completed", run.state
    assert run.started_at and run.finished_at
    return (run.finished_at - run.started_at).total_seconds()


SETTLE_S = 3.0  # after each side's warm-up, before measuring (see batch_scripts.FLOW)
MAKESPAN_CONFIGS = [(200, 200, 8), (200, 200, 32), (200, 2000, 8)]  # items, ms, concurrency
BENCH_PROFILE = (
    "profiles:\n  bench:\n    kind: fake\n    cost_per_image_minor: 1\n    max_concurrency: 64\n"
)


def _python(code: str, env: dict[str, str]) -> tuple[float, float, float]:
    """Run a measuring script; its makespan, the CPU time its process spent meanwhile
    (seconds, all its threads; Prefect's ephemeral server is a process of its own) and its
    body's time (`batch_scripts`: until the work was done, before Prefect ended the run)."""
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, text=True, capture_output=True
    ).stdout
    wall, cpu, body = out.strip().splitlines()[-1].split()
    return float(wall), float(cpu), float(body)


def _bench_home(tmp: Path, name: str, items: int, url: str | None = None) -> tuple[Path, str, str]:
    home = tmp / name
    home.mkdir(parents=True)
    (home / "providers.yaml").write_text(BENCH_PROFILE)
    url = url or f"sqlite:///{home / 'episodic.db'}"
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from episodic.storage.engine import make_engine
    from episodic.storage.schema import upgrade
    from tests.generation import write_playlist

    os.environ["EPISODIC_PROVIDERS_FILE"] = str(home / "providers.yaml")
    engine = make_engine(url)
    upgrade(engine)
    episode = str(
        allocate(engine, "weekly", WeekId.parse("2026-W32"), f"bench-{name}").episode.episode_id
    )
    playlist = write_playlist(
        home / "pl", [f"video {n}" for n in range(1, items + 1)], profile="bench"
    )
    record_plan(engine, "weekly", episode, playlist)
    engine.dispose()
    return home, url, episode


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _rounds_text(ratios: list[float]) -> str:
    return f"; rounds {min(ratios):.2f}x-{max(ratios):.2f}x" if len(ratios) > 1 else ""


def _cli(home: Path, episode: str, concurrency: int, env: dict[str, str]) -> tuple[float, float]:
    """`episodic generate` in a subprocess: the run's makespan (the ledger's) and the whole
    command's wall time."""
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "episodic.cli.app",
            "generate",
            episode,
            "--concurrency",
            str(concurrency),
            "--json",
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    return _run_makespan(f"sqlite:///{home / 'episodic.db'}"), wall


def bench_cli(
    tmp: Path, tag: str, config: tuple[int, int, int], n_rounds: int, s3: S3 = None
) -> None:
    """The CLI against the ideal; with `s3` (a running `tests.s3_server.S3Server` and a
    bucket on it), also with the media store in that bucket, each round the local folder
    and then S3 side by side."""
    items, latency_ms, concurrency = config
    ideal = math.ceil(items / concurrency) * latency_ms / 1000
    local: list[tuple[float, float]] = []
    remote: list[float] = []
    for n in range(n_rounds if s3 is not None else 1):
        for where in ["local"] + (["s3"] if s3 is not None else []):
            home, _url, episode = _bench_home(tmp, f"cli-{where}-{tag}-{n}", items)
            extra = {"EPISODIC_FAKE_DELAY_MS": str(latency_ms)}
            extra["EPISODIC_PROVIDERS_FILE"] = str(home / "providers.yaml")
            if where == "s3" and s3 is not None:
                server, bucket = s3
                extra |= server.env() | {"EPISODIC_MEDIA_URL": f"s3://{bucket}/{tag}-{n}"}
            run, wall = _cli(home, episode, concurrency, _env(home, None, **extra))
            if where == "local":
                local.append((run, wall))
            else:
                remote.append(run)
    run = _median([r for r, _ in local])
    wall = _median([w for _, w in local])
    print(
        f"    CLI run            {run:6.2f} s = {run / ideal:.2f}x ideal (target <= 1.10x; "
        f"whole command {wall:.2f} s)"
    )
    if remote:
        ratios = [s / f for s, (f, _) in zip(remote, local, strict=True)]
        print(
            f"    CLI run, S3 store  {_median(remote):6.2f} s = {_median(ratios):.2f}x the local "
            f"folder's (target <= 1.10x{_rounds_text(ratios)}; moto on loopback)"
        )


def bench_makespan(
    tmp: Path,
    skip_flow: bool,
    configs: list[tuple[int, int, int]] = MAKESPAN_CONFIGS,
    postgres_url: Any = None,
    heartbeats: bool = False,
    rounds: int = 3,
    s3: S3 = None,
) -> None:
    """(a) the flow against both floors on the same runner and server, the CLI against ideal
    (and with an S3 store against the local folder, when `s3` is a running server).

    `postgres_url`: a callable returning a fresh migrated Postgres URL, to run the flow on
    Postgres as well (None: SQLite only). Configurations of items under a second run
    `rounds` rounds, each measuring the sleeping floor, the same-work floor and then the flow
    on each backend, one after the other: every ratio is the median of the rounds' own
    ratios (the machine's speed drifts by tens of percent within minutes, so only
    measurements side by side are compared), with the range of the rounds. Slower items run
    one round (a drift of the same size is a few percent of their makespan)."""
    prefect_home = ROOT / ".episodic" / "prefect"  # reuse the migrated ephemeral server db
    for items, latency_ms, concurrency in configs:
        ideal = math.ceil(items / concurrency) * latency_ms / 1000
        n_rounds = rounds if latency_ms < 1000 else 1
        print(
            f"(a) makespan: {items} items x {latency_ms} ms, concurrency {concurrency}: "
            f"ideal {ideal:.2f} s ({n_rounds} round{'s' if n_rounds > 1 else ''})"
        )
        tag = f"{items}x{latency_ms}ms-c{concurrency}"
        bench_cli(tmp, tag, (items, latency_ms, concurrency), n_rounds, s3)
        if skip_flow:
            continue
        env_prefect = {
            **_env(tmp, None, EPISODIC_FAKE_DELAY_MS=str(latency_ms)),
            "PREFECT_HOME": str(prefect_home),
        }
        common = {"settle_s": SETTLE_S, "concurrency": concurrency, "heartbeats": heartbeats}

        def floor_script(gcl: bool) -> str:
            return FLOOR.format(latency_s=latency_ms / 1000, items=items, gcl=gcl, **common)

        backends = ["SQLite"] + (["Postgres"] if postgres_url else [])
        floors: list[tuple[float, float, float]] = []
        same: list[tuple[float, float, float]] = []
        flows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in backends}
        for n in range(n_rounds):
            floors.append(_python(floor_script(False), env_prefect))
            work = tmp / f"same-work-{tag}-{n}"
            same.append(
                _python(
                    SAME_WORK.format(work=str(work), latency_ms=latency_ms, items=items, **common),
                    env_prefect,
                )
            )
            for backend in backends:
                db_url = postgres_url() if backend == "Postgres" else None
                home, url, episode = _bench_home(tmp, f"flow-{backend}-{tag}-{n}", items, db_url)
                env_flow = {
                    **_env(
                        home,
                        url,
                        EPISODIC_FAKE_DELAY_MS=str(latency_ms),
                        EPISODIC_PROVIDERS_FILE=str(home / "providers.yaml"),
                    ),
                    "PREFECT_HOME": str(prefect_home),
                }
                flows[backend].append(_python(FLOW.format(episode=episode, **common), env_flow))
        for name, sides in (("bare Prefect floor", floors), ("same-work floor   ", same)):
            wall = _median([w for w, _, _ in sides])
            spread = ", ".join(f"{w:.2f}" for w, _, _ in sides)
            bodies = ", ".join(f"{b:.2f}" for _, _, b in sides)
            print(
                f"    {name} {wall:6.2f} s = {wall / ideal:.2f}x ideal "
                f"(CPU {_median([c for _, c, _ in sides]):.2f} s; rounds: {spread} s; "
                f"bodies: {bodies} s)"
            )
        if (latency_ms, concurrency) == (200, 8):  # the slot-per-item pattern, once
            gcl, _, _ = _python(floor_script(True), env_prefect)
            print(
                f"    floor + a GCL slot per item {gcl:6.2f} s = {gcl / floors[-1][0]:.2f}x "
                "the floor of the last round (the pattern replaced by claims)"
            )
        for backend in backends:
            measured = flows[backend]
            ratios = [f[0] / b[0] for f, b in zip(measured, floors, strict=True)]
            same_ratios = [f[0] / b[0] for f, b in zip(measured, same, strict=True)]
            cpu_ratios = [f[1] / b[0] for f, b in zip(measured, floors, strict=True)]
            wall = _median([f[0] for f in measured])
            spread = ", ".join(f"{f[0]:.2f}" for f in measured)
            print(
                f"    generate_episode, {backend:8} {wall:6.2f} s = {_median(ratios):.2f}x the floor "
                f"(sleeping{_rounds_text(ratios)}; {wall / ideal:.2f}x ideal; CPU "
                f"{_median([f[1] for f in measured]):.2f} s = "
                f"{_median(cpu_ratios):.2f}x the floor's makespan; rounds: {spread} s)"
            )
            print(
                f"      against the same-work floor: {_median(same_ratios):.2f}x "
                f"(target <= 1.15x{_rounds_text(same_ratios)})"
            )
            # Prefect ends a flow run with heartbeats on the heartbeat thread's next 1 s
            # tick (it sleeps in whole seconds and is joined at the end), so with
            # --prefect-heartbeats every makespan above is a whole number of seconds plus
            # a constant: the bodies' times are not rounded.
            body_ratios = [f[2] / b[2] for f, b in zip(measured, same, strict=True)]
            print(
                f"      body against the same-work floor's body: {_median(body_ratios):.2f}x "
                f"(rounds {min(body_ratios):.2f}x-{max(body_ratios):.2f}x; bodies: "
                + ", ".join(f"{f[2]:.2f}" for f in measured)
                + " s)"
            )


def bench_planning(tmp: Path, backends: dict[str, Any]) -> None:
    print("\n(c) planning a resume of 100,000 items, 99% complete (target < 1 s)")
    from sqlalchemy import update

    from episodic.core.planning import RunOptions
    from episodic.core.playlist import PlannedItem
    from episodic.core.settings import load_settings
    from episodic.pipeline.admission import admit_run, dedup_policy, plan, run_request
    from episodic.pipeline.gate import open_gate
    from episodic.providers.profiles import BUILTIN
    from episodic.storage.admission import AdmissionStore
    from episodic.storage.engine import make_engine
    from episodic.storage.models import ItemRow
    from episodic.storage.plans import PlanStore

    for name, make_url in backends.items():
        url = make_url()
        episode = _setup_episode(url, tmp / f"plan-{name}", 1)
        engine = make_engine(url)
        gate = open_gate(engine, "weekly", episode, "generate")
        items = [
            PlannedItem(n, f"v{n}", 1, f"prompt {n}", n, f"{n:032x}") for n in range(1, 100_001)
        ]
        options = RunOptions()
        profile = BUILTIN["fake"]
        admission = admit_run(  # through the choke point, as every run is made
            AdmissionStore(engine),
            gate,
            items,
            plan(PlanStore(engine), gate, items, options, profile),
            options,
            profile,
            run_request(gate, items, options, profile),
            dedup_policy(load_settings()),
        )
        assert admission.created, admission
        with engine.begin() as conn:
            conn.execute(update(ItemRow).where(ItemRow.position > 1000).values(state="completed"))
        start = time.perf_counter()
        report = plan(PlanStore(engine), gate, items, options, BUILTIN["fake"])
        elapsed = time.perf_counter() - start
        assert report.skipped == 99_000 and report.new_calls == 1000, report
        print(
            f"    {name:8} {elapsed:6.3f} s  ({report.new_calls} to run, {report.skipped} skipped)"
            f"{'' if elapsed < 1 else '  over target'}"
        )
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--skip-flow", action="store_true")
    parser.add_argument(
        "--skip-s3", action="store_true", help="no CLI run with the media store on S3 (moto)"
    )
    parser.add_argument(
        "--makespan",
        metavar="ITEMS:MS:CONCURRENCY",
        action="append",
        help="only these makespan configurations (e.g. 200:200:32); skips (c)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of floor and flow, side by side, for items under a second (default 3)",
    )
    parser.add_argument(
        "--prefect-heartbeats",
        action="store_true",
        help="keep Prefect's flow-run heartbeats on (its default, every 180 s) in the floor "
        "and the flow: Prefect 3.9's heartbeat thread sleeps in 1 s steps and the end of every "
        "flow run waits for it, adding 0-1 s to each and rounding makespans up to whole "
        "seconds; by default both sides run without it",
    )
    args = parser.parse_args()
    configs = (
        [tuple(int(n) for n in spec.split(":")) for spec in args.makespan]
        if args.makespan
        else MAKESPAN_CONFIGS
    )
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory(prefix="episodic-batch-") as name:
        tmp = Path(name)
        backends: dict[str, Any] = {}
        counter = iter(range(1000))
        backends["sqlite"] = lambda: f"sqlite:///{tmp / f'db-{next(counter)}' / 'episodic.db'}"
        pg = None
        created: list[str] = []  # only these are dropped (others may be a test run's)
        if not args.skip_postgres:
            from tests.databases import PostgresDatabases

            pg = PostgresDatabases()

            def fresh_postgres() -> str:
                created.append(pg.fresh(migrated=True))
                return pg.url(created[-1])

            backends["postgres"] = fresh_postgres
        with contextlib.ExitStack() as stack:
            s3: S3 = None
            if not args.skip_s3:  # a moto S3 server process on loopback, as the tests run it
                from tests.s3_server import running_s3_server

                server = stack.enter_context(running_s3_server(tmp / "s3"))
                s3 = (server, server.new_bucket())
            try:
                bench_makespan(
                    tmp,
                    args.skip_flow,
                    configs,  # type: ignore[arg-type]
                    backends.get("postgres"),
                    heartbeats=args.prefect_heartbeats,
                    rounds=max(1, args.rounds),
                    s3=s3,
                )
                if not args.makespan:
                    bench_planning(tmp, backends)
            finally:
                if pg is not None:
                    for db in created:
                        pg.drop(db)
                    pg.close()


if __name__ == "__main__":
    main()
