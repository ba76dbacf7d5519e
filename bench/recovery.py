"""Recovery after `kill -9` against the provider's latency.

For each backend (SQLite: a file under a temp EPISODIC_HOME; Postgres: a throwaway database on
the local server, migrated and dropped at the end), with the installed `episodic` command and a
fake provider profile of `--limit` slots whose jobs take `--delay-ms` and may run `--max-job-s`:

1. baseline: a clean `episodic generate` of an episode of `--items` images at concurrency
   `--limit` (no kill): the provider's latency for the whole work, in the same database;
2. the same episode shape generated in the background, killed with SIGKILL as soon as the
   profile's whole limit of jobs is at the provider (its accepted jobs hold every slot), then
   `episodic retry EPISODE` timed from its start to its exit:
   - ``at once``: started right after the kill, while the dead process's claims are still
     under their lease (`--lease-s`): it cannot take them over before the lease runs out;
   - ``after lease``: started once the lease has run out.
   The recovery collects the dead process's accepted jobs first instead of waiting
   `max_job_s` behind them, so only the lease (at once) and the provider's latency remain.

Printed per row: seconds, and the ratio to the baseline's seconds (the provider's latency
for the same work); the lease and `max_job_s` are printed beside them so a ratio can be read
against what it waited for. Checked afterwards: every image completed and the provider made
exactly one job per item (its job store). A benchmark, never a test: nothing here asserts a
timing.

Run: .venv/bin/python -m bench.recovery [--skip-postgres] [--items N] [--limit N]
     [--delay-ms MS] [--max-job-s S] [--lease-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.claims import postgres_database

ROOT = Path(__file__).resolve().parent.parent
EPISODIC = shutil.which("episodic", path=str(Path(sys.executable).parent))


@dataclass
class Row:
    backend: str
    scenario: str
    seconds: float
    check: str


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    assert EPISODIC is not None, "the episodic command is not installed in this environment"
    done = subprocess.run([EPISODIC, *args], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"episodic {' '.join(args)}: exit {done.returncode}: {done.stderr}")
    return done


def _episode(home: Path, key: str, items: int) -> str:
    import yaml

    allocated = json.loads(_cli("allocate", "--key", key, "--week", "2026-W32", "--json").stdout)
    episode_id = str(allocated["episode_id"])
    videos = [{"video_id": f"v{n:02d}", "title": f"{key} {n}", "seed": n} for n in range(items)]
    playlist = home / f"{key}.yaml"
    playlist.write_text(
        yaml.safe_dump(
            {
                "template": {"id": "cover", "version": 1, "prompt": "cover for {title}"},
                "provider_profile": "slow",
                "items": videos,
            },
            sort_keys=False,
        )
    )
    _cli("plan", episode_id, "--playlist", str(playlist))
    return episode_id


def _jobs(home: Path) -> Counter[str]:
    """Jobs the fake provider holds, per client reference's item key (one file each)."""
    return Counter(
        json.loads(path.read_text())["client_reference"].rsplit("-", 1)[0]
        for path in (home / "fake-provider").glob("*.json")
    )


def _timed_generate(episode_id: str, limit: int) -> float:
    start = time.perf_counter()
    _cli("generate", episode_id, "--concurrency", str(limit), "--json")
    return time.perf_counter() - start


def _killed_then_retried(
    home: Path, episode_id: str, limit: int, after_lease_s: float | None
) -> float:
    assert EPISODIC is not None
    before = len(list((home / "fake-provider").glob("*.json")))
    process = subprocess.Popen(
        [EPISODIC, "generate", episode_id, "--concurrency", str(limit)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(list((home / "fake-provider").glob("*.json"))) < before + limit:
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the generate to kill made no progress")
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    if after_lease_s is not None:
        time.sleep(after_lease_s)
    start = time.perf_counter()
    answer = json.loads(_cli("retry", episode_id, "--json").stdout)
    seconds = time.perf_counter() - start
    if answer["state"] != "completed":
        raise SystemExit(f"retry of {episode_id}: {answer}")
    return seconds


def bench_backend(backend: str, url: str, home: Path, args: argparse.Namespace) -> list[Row]:
    from episodic.storage.engine import make_engine
    from episodic.storage.schema import upgrade

    home.mkdir(parents=True, exist_ok=True)
    profiles = home / "providers.yaml"
    profiles.write_text(
        "profiles:\n  slow:\n    kind: fake\n    cost_per_image_minor: 4\n"
        f"    max_concurrency: {args.limit}\n    delay_ms: {args.delay_ms}\n"
        f"    max_job_s: {args.max_job_s}\n"
    )
    os.environ.update(
        EPISODIC_HOME=str(home),
        EPISODIC_DATABASE_URL=url,
        EPISODIC_PROVIDERS_FILE=str(profiles),
        EPISODIC_LEASE_S=str(args.lease_s),
    )
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    rows = []
    clean = _episode(home, "clean", args.items)
    seconds = _timed_generate(clean, args.limit)
    rows.append(Row(backend, "baseline: clean generate", seconds, "-"))
    print(f"  {backend}: baseline {seconds:.2f} s", flush=True)
    for scenario, wait in (("kill -9, retry at once", None), ("kill -9, retry after lease", 0.0)):
        episode_id = _episode(home, f"k{len(rows)}", args.items)
        pause = None if wait is None else args.lease_s + 1.0
        seconds = _killed_then_retried(home, episode_id, args.limit, pause)
        jobs = _jobs(home)
        check = "one job per item" if set(jobs.values()) == {1} else f"PAID TWICE {jobs}"
        rows.append(Row(backend, scenario, seconds, check))
        print(f"  {backend}: {scenario} {seconds:.2f} s", flush=True)
    if len(_jobs(home)) != 3 * args.items:
        rows[-1].check += f"; {len(_jobs(home))} jobs for {3 * args.items} items"
    return rows


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    header = f"{'backend':9} {'scenario':28} {'seconds':>8} {'ratio':>6}  check"
    print("\n" + header)
    print("-" * len(header))
    baseline: dict[str, float] = {}
    for row in rows:
        baseline.setdefault(row.backend, row.seconds)
        ratio = row.seconds / baseline[row.backend]
        print(f"{row.backend:9} {row.scenario:28} {row.seconds:>8.2f} {ratio:>6.2f}  {row.check}")
    print(
        f"\nratio = seconds / the clean generate's seconds (the provider's latency for the same "
        f"{args.items} images at {args.limit} slots, {args.delay_ms} ms a job); the lease is "
        f"{args.lease_s} s and max_job_s {args.max_job_s} s: a recovery that waits for the "
        "dead process's jobs to age out instead of collecting them shows max_job_s here."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--items", type=int, default=6)
    parser.add_argument("--limit", type=int, default=2, help="the profile's max_concurrency")
    parser.add_argument("--delay-ms", type=int, default=3000, help="how long a job takes")
    parser.add_argument("--max-job-s", type=int, default=60, help="the profile's max_job_s")
    parser.add_argument("--lease-s", type=float, default=30.0, help="EPISODIC_LEASE_S")
    args = parser.parse_args()
    os.chdir(ROOT)
    os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
    os.environ.pop("EPISODIC_FAKE_DELAY_MS", None)
    print(
        f"recovery: {args.items} images, {args.limit} slots, {args.delay_ms} ms a "
        f"job, max_job_s {args.max_job_s}, lease {args.lease_s} s"
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="episodic-recovery-") as name:
        tmp = Path(name)
        home = tmp / "sqlite"
        rows += bench_backend("sqlite", f"sqlite:///{home / 'episodic.db'}", home, args)
        if not args.skip_postgres:
            with postgres_database("recovery") as url:
                rows += bench_backend("postgres", url, tmp / "postgres", args)
    print_table(rows, args)


if __name__ == "__main__":
    main()
