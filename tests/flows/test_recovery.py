"""The generate flow recovering after `kill -9` of a generating flow process: the Prefect
executor (item tasks) collects the dead process's accepted jobs before it buys anything new
(the thread pool's twin is in tests/acceptance/test_crash_recovery.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from episodic.core.ids import WeekId
from episodic.flows.generate import generate_episode
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from episodic.storage.engine import make_engine
from tests.generation import made_jobs_per_key, provider_log, write_playlist

pytestmark = pytest.mark.slow

PROFILE = (
    "profiles:\n  slow:\n    kind: fake\n    cost_per_image_minor: 4\n"
    "    max_concurrency: 2\n    delay_ms: 1500\n    max_job_s: 60\n"
)


def _dead_flow(episode_id: str) -> tuple[int, set[str], set[str]]:
    """A generate flow run in its own process, killed (-9) once the profile's whole limit
    (2 jobs) is at the provider; returns its pid, the jobs it left and their references."""
    from prefect.settings import PREFECT_API_URL

    code = (
        "import episodic.tasks\nfrom episodic.flows.generate import generate_episode\n"
        f"generate_episode(episode_id={episode_id!r}, concurrency=2, max_images=6)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while sum(1 for e in provider_log() if e["event"] == "job_created") < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the flow never started paying"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    events = provider_log()
    # On a loaded machine the killed process may have collected a job before the kill landed:
    # the jobs it left are those it created and never collected.
    collected = {e["remote_ref"] for e in events if e["event"] == "collect"}
    created = [e for e in events if e["event"] == "job_created"]
    jobs = {e["remote_ref"] for e in created} - collected
    references = {e["client_reference"] for e in events if e["event"] == "submit"}
    assert jobs, "the killed flow left no accepted job behind"
    return process.pid, jobs, references


def test_the_flow_collects_a_killed_flows_jobs_before_any_new_create(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both slots of the profile are held by the jobs the killed flow had accepted, under
    claims that stay live for the lease (15 s). The recovering flow run, throttled, does
    not wait `max_job_s` (60 s) asking for a slot for its next new item: it collects those
    jobs as soon as the leases run out, before any new create (the order at the provider,
    not a duration); one job per item, counted in the provider's job store."""
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(PROFILE)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_LEASE_S", "15")
    engine = make_engine(harness)
    allocated = allocate(engine, "weekly", WeekId.parse("2026-W32"), f"k-{tmp_path.name}")
    episode_id = str(allocated.episode.episode_id)
    titles = [f"t{n}" for n in range(6)]
    record_plan(
        engine, "weekly", episode_id, write_playlist(tmp_path / "pl", titles, profile="slow")
    )
    engine.dispose()

    pid, dead, dead_refs = _dead_flow(episode_id)
    # --max-images, no money limit: the dead flow's first two calls went at once (a price never
    # billed is otherwise probed with one call first, `storage.budgets`); it joins the dead run
    result = generate_episode(episode_id=episode_id, concurrency=2, max_images=6)
    assert result["state"] == "completed", result
    made = made_jobs_per_key()
    assert len(made) == 6 and set(made.values()) == {1}, made
    recovering = [e for e in provider_log() if e["pid"] != pid]
    assert dead <= {e["remote_ref"] for e in recovering if e["event"] == "collect"}
    order = [
        "collect-dead" if e["event"] == "collect" else "create-new"
        for e in recovering
        if (e["event"] == "collect" and e["remote_ref"] in dead)
        or (e["event"] == "submit" and e["client_reference"] not in dead_refs)
    ]
    assert order[0] == "collect-dead", order  # before it bought anything new
    assert order.count("create-new") == 4, order
