"""Generating processes killed (SIGKILL, SIGTERM, SIGINT) at random moments: `episodic
generate` and Prefect flow-run processes, against the fake provider with latency, transient
failures and lost replies."""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from reliability.harness import (
    EPISODIC,
    Backend,
    Result,
    check_all,
    fake_profiles,
    in_parallel,
    open_engine,
    recover_and_check,
    signal_some,
    trial_env,
    trial_episode,
)


def generate_crash(backend: Backend, trials: int, rng: random.Random) -> Result:
    """`episodic generate` killed (SIGKILL, SIGTERM or SIGINT) at a random moment, one or two
    processes on one episode, against the fake provider with latency, transient failures and
    lost replies; then the sweep and the one recovery command (`episodic generate EPISODE`,
    which also covers a process killed before it made its run): every item
    completed, one provider job per item, nothing stuck, `check` clean."""
    result = Result("generate-crash", backend.name)
    url = backend.fresh()
    engine = open_engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-gen-"))
    profiles = fake_profiles(root, trials)
    items = 6
    guard = threading.Lock()
    plans = _trial_plans(engine, root, trials, items, rng)

    def one(trial: int, episode_id: str, seed: int) -> None:
        local = random.Random(seed)
        home = root / f"home{trial}"
        home.mkdir(parents=True, exist_ok=True)
        env = trial_env(home, url, profiles)
        together = 2 if local.random() < 0.4 else 1
        command = [EPISODIC, "generate", episode_id, "--json", "--concurrency", "3"]
        processes = [
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(together)
        ]
        time.sleep(local.uniform(0.3, 2.0))  # a run of 6 items lasts about 2-3 s here
        fault, signalled = signal_some(processes, local)
        recover_and_check(
            result,
            guard,
            engine,
            env,
            episode_id,
            items,
            home,
            trial,
            processes,
            fault,
            signalled=signalled,
            cli=True,
        )

    in_parallel(plans, one)
    clean = check_all(result, url, root)
    result.notes = (
        f"{items} items per episode, fake provider 300 ms per job, a third of the prompts with "
        "a transient failure, a lost reply or a 0.9 s job; recovery: `episodic sweep`, then "
        f"`episodic generate EPISODE`; `check --all` at the end: {clean}"
    )
    engine.dispose()
    return result


_FLOW = (
    "from episodic.flows.generate import generate_episode\n"
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
    engine = open_engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-flow-"))
    profiles = fake_profiles(root, trials)
    items = 6
    guard = threading.Lock()
    plans = _trial_plans(engine, root, trials, items, rng)
    server = PrefectServer(tmp_dir=root / "prefect", ui=False).start()

    def one(trial: int, episode_id: str, seed: int) -> None:
        local = random.Random(seed)
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = server.env(trial_env(home, url, profiles))
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
        fault, signalled = signal_some(processes, local)
        recover_and_check(
            result,
            guard,
            engine,
            env,
            episode_id,
            items,
            home,
            trial,
            processes,
            fault,
            signalled=signalled,
            cli=False,
        )

    try:
        in_parallel(plans, one)
    finally:
        server.stop()
    clean = check_all(result, url, root)
    result.notes = (
        f"{items} items per episode, the flow on the thread runner with concurrency 3, fake "
        "provider 300 ms per job with the same markers as generate-crash, two flow runs on "
        "one episode in about a third of the trials; recovery: `episodic sweep`, then "
        "`episodic generate EPISODE` (the CLI finishes what the flow started); `check --all` "
        f"at the end: {clean}"
    )
    engine.dispose()
    return result


def _trial_plans(
    engine: Any, root: Path, trials: int, items: int, rng: random.Random
) -> list[tuple[int, str, int]]:
    """One planned episode of `items` images per trial, with the seed of that trial's
    kills: ``[(trial, episode_id, seed)]``."""
    plans = []
    for trial in range(trials):
        seed = rng.randrange(2**32)
        episode_id, _ = trial_episode(
            engine, root / f"pl{trial}", trial, items, rng, root / "providers.yaml"
        )
        plans.append((trial, episode_id, seed))
    return plans
