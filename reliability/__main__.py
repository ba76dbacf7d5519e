"""Run the fault suite and write its report (docs/reliability.md by default).

    .venv/bin/python -m reliability                       # everything, both backends
    .venv/bin/python -m reliability --only alloc-crash --backend sqlite
    .venv/bin/python -m reliability --scale 0.1 --report /tmp/r.md   # a quick pass

Exit 0 when every scenario held, 1 when one found a fault (the report says which and how),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from reliability.harness import Backend, Result
from reliability.scenarios import ONLY_ON, SCENARIOS, TRIALS

ROOT = Path(__file__).resolve().parent.parent


def table_row(result: Result) -> str:
    faults = ", ".join(f"{name} {n}" for name, n in sorted(result.faults.items())) or "-"
    money = (
        f"{result.paid_jobs} / {result.logical_items}" if result.logical_items is not None else "-"
    )
    episodes = f"{result.episodes} / {result.keys}" if result.keys is not None else "-"
    verdict = "held" if result.passed else "**FAULT**"
    stuck = "-" if result.stuck is None else result.stuck
    return (
        f"| {result.scenario} | {result.backend} | {result.trials} | {faults} | {money} | "
        f"{episodes} | {stuck} | {result.lost} | {verdict} | {result.seconds:.0f} s | "
        f"`{result.rerun()}` |"
    )


def keep_forensics(tmp: Path, kept: Path, results: list[Result]) -> None:
    """Copy every failed trial's forensics (its stderr, threads' stacks, ledger rows) out of
    the run's temporary folder before it goes, and point the report's problems at the copies."""
    found = sorted(tmp.rglob("forensics*.txt"))
    if not found:
        return
    for path in found:
        target = kept / path.relative_to(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    for result in results:
        result.problems = [p.replace(str(tmp), str(kept)) for p in result.problems]
    print(f"forensics of failed trials: {kept}", flush=True)


def report(results: list[Result], command: str, seed: int) -> str:
    lines = [
        "# Reliability",
        "",
        "Written by `make reliability` (`.venv/bin/python -m reliability`): every figure below",
        "comes from the run that wrote this file. Money is counted where it is spent: the fake",
        "provider's own log of the jobs it made, or the local HTTP provider server's count of",
        "jobs and its bill; never from the project's own tables. Episodes are counted in the",
        "database against the allocation keys asked for.",
        "",
        "Columns: *faults injected* counts only faults that reached a live process (a trial",
        "whose processes had all finished before the signal is listed as `none`); *stuck rows*",
        "are runs or items left running and submissions left open after recovery (`-` where",
        "a scenario makes no such rows); *data lost* counts allocations reported to a caller",
        "but missing, and completed images missing or no longer matching their recorded",
        "SHA-256. Any stuck row, lost datum or problem makes the scenario a FAULT.",
        "",
        f"- run: `{command}` (seed {seed}) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        "",
        "| scenario | backend | trials | faults injected | provider jobs / items | "
        "episodes kept / allocations reported | stuck rows | data lost | result | time | "
        "rerun alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(table_row(r) for r in results),
        "",
        "## What each scenario does",
        "",
    ]
    for name, scenario in SCENARIOS.items():
        doc = " ".join((scenario.__doc__ or "").split())
        lines.append(f"- **{name}**: {doc}")
    lines += ["", "## Notes and findings", ""]
    for result in results:
        lines.append(f"- {result.scenario} ({result.backend}): {result.notes}")
        lines += [f"  - FAULT: {problem}" for problem in result.problems]
    lines += [
        "",
        "## In `make test` instead",
        "",
        "Faster evidence of the same promises runs with every `make test`, on SQLite and",
        "PostgreSQL:",
        "",
        "- `tests/property`: hypothesis models of ISO weeks (every day 1970-2100, six",
        "  timezones), of the allocator and of the claims (frozen holders, takeovers, lost",
        "  replies, late refusals); the fuzz of every command (`test_cli_fuzz.py`), of every flow",
        "  parameter (`test_flow_params_fuzz.py`), of malformed playlist, legacy and provider",
        "  files (`test_file_fuzz.py`) and of malformed provider replies from a local server",
        "  (`test_provider_reply_fuzz.py`);",
        "- `tests/integration/test_db_outage.py`: a batch riding out restarts of a private",
        "  PostgreSQL cluster; `tests/integration/test_races.py`: real processes released",
        "  together; `tests/acceptance/test_secret_never_leaks.py`: the provider secret in no",
        "  log, output, exception, database row or request to another host.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability",
        description="The fault suite: real processes killed at random moments, provider "
        "faults in random mixtures; writes a report of what held.",
    )
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append", help="a scenario")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every scenario's trials (0.01-10)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("--report", type=Path, default=None, help="where to write the report")
    args = parser.parse_args()
    if not 0.01 <= args.scale <= 10:
        parser.error("--scale must be between 0.01 and 10")
    if args.report is not None and not (
        args.report.parent.is_dir() and os.access(args.report.parent, os.W_OK)
    ):  # said now, not after 20 minutes of trials
        parser.error(f"--report: {args.report.parent} is not a writable folder")
    seed = args.seed if args.seed is not None else int(time.time())
    only = args.only or list(SCENARIOS)
    backends = args.backend or ["sqlite", "postgres"]
    runnable = [(n, b) for b in backends for n in only if ONLY_ON.get(n, b) == b]
    if not runnable:  # said, rather than a report with an empty table and exit 0
        parser.error(
            "nothing to run: "
            + ", ".join(f"{n} runs on {ONLY_ON[n]} only" for n in only if n in ONLY_ON)
        )
    whole = args.only is None and args.backend is None and args.scale == 1.0
    target = args.report or (ROOT / "docs" / "reliability.md" if whole else None)
    os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    results: list[Result] = []
    kept = Path(tempfile.gettempdir()) / f"episodic-reliability-forensics-{seed}"
    with tempfile.TemporaryDirectory(prefix="episodic-reliability-") as tmp:
        # Everything a scenario makes stays in here and goes with it: its temporary folders,
        # and the home of what runs in this process (never the user's ./.episodic).
        tempfile.tempdir = tmp
        os.environ["EPISODIC_HOME"] = str(Path(tmp) / "home")
        for backend_name in backends:
            backend = Backend(backend_name, Path(tmp) / backend_name)
            try:
                for name in only:
                    if ONLY_ON.get(name, backend_name) != backend_name:
                        continue
                    trials = max(1, round(TRIALS[name] * args.scale))
                    rng = random.Random(f"{seed}:{name}:{backend_name}")
                    print(f"{name} on {backend_name}: {trials} trials ...", flush=True)
                    started = time.monotonic()
                    result = SCENARIOS[name](backend, trials, rng)
                    result.seed, result.scale = seed, args.scale
                    result.seconds = time.monotonic() - started
                    results.append(result)
                    verdict = "held" if result.passed else "FAULT: " + "; ".join(result.problems)
                    print(f"    {verdict} ({result.seconds:.0f} s) {result.notes}", flush=True)
            finally:
                backend.close()
        keep_forensics(Path(tmp), kept, results)
    command = "python -m reliability " + " ".join(sys.argv[1:])
    text = report(results, command.strip(), seed)
    if target is not None:
        target.write_text(text, encoding="utf-8")
        print(f"report: {target}")
    else:
        print(text)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
