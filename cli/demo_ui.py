"""`episodic demo --ui`: the demo against a real local Prefect server that stays up.

`local_server` starts ``prefect server start`` as a child process on a free localhost port
(its home, database and log in the state folder, telemetry off, its own session so a
terminal's Ctrl-C reaches only this process) and points this process's Prefect client at it.
After the demo, `leave_one_waiting` runs one more weekly flow run with generation on: it
pays for its images (fake provider) and suspends on the approval form with them. Then
`wait_for_interrupt` prints the UI's addresses and waits; an answer given in the form resumes
the run, which this process then executes to its end (assembled, or rejected). Ctrl-C stops
the server (the process group, then the port is free) and ends the command with one line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from episodic.cli import context
from episodic.cli.demo_output import Reporter

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 300  # the first start migrates Prefect's database (20-30 s on 2 cores)
STOP_GRACE_S = 20
POLL_S = 1.0


@dataclass
class LocalServer:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after a grace period.
        Idempotent."""
        if self.proc.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_GRACE_S)
        with suppress(ProcessLookupError, PermissionError):  # the group's other processes
            os.killpg(self.proc.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def local_server(report: Reporter) -> Iterator[LocalServer]:
    """A `prefect server start` for this command, stopped when the block ends however it
    ends; this process's Prefect client talks to it (set before Prefect is imported)."""
    import episodic.tasks  # noqa: F401  (Prefect defaults: PREFECT_HOME in the state folder)
    from episodic.core.errors import EpisodicError

    home = context.settings().home_path
    port = _free_port()
    log_path = home / "prefect-server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_API_KEY")}
    env.update(
        {
            "PREFECT_HOME": os.environ["PREFECT_HOME"],
            "PREFECT_SERVER_API_HOST": HOST,
            "PREFECT_SERVER_API_PORT": str(port),
            "PREFECT_SERVER_UI_API_URL": f"http://{HOST}:{port}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PREFECT_CLI_PROMPT": "false",
        }
    )
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST]
    command += ["--port", str(port), "--analytics-off"]
    report.line(
        f"starting a Prefect server on http://{HOST}:{port} (the first start migrates its "
        "database: 20-30 s)…"
    )
    report.line(f"  its log: {log_path}")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LocalServer(proc, port, log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(server.api_url):
            if not server.alive():
                raise EpisodicError(
                    f"the Prefect server exited with {proc.returncode} while starting "
                    f"(see {log_path})"
                )
            if time.monotonic() > deadline:
                raise EpisodicError(
                    f"the Prefect server did not answer within {STARTUP_TIMEOUT_S} s "
                    f"(see {log_path})"
                )
            time.sleep(0.5)
        os.environ["PREFECT_API_URL"] = server.api_url
        yield server
    except KeyboardInterrupt:  # Ctrl-C, whenever it comes while the server is up: one line
        from episodic.cli.signals import interrupts

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: it is stopping
        _drain_prefect()
        server.stop()
        sys.stderr.write(f"interrupted: the Prefect server on {server.url} is stopped\n")
        interrupts.mark_reported()
        raise typer.Exit(130) from None
    finally:
        _drain_prefect()
        server.stop()


def _drain_prefect() -> None:
    """Send what Prefect's background workers still hold (run logs, events) while the
    server is up, so nothing complains about it at exit."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with suppress(Exception):
            worker.drain_all(timeout=10, at_exit=False)


def _waiting_run(deployment_id: Any) -> Any | None:
    """A weekly run of the demo deployment already waiting on its approval form (an
    earlier `demo --ui`): shown again rather than paying for another episode."""
    from prefect.client.schemas.objects import StateType

    from episodic.flows import local

    for run in local.deployment_flow_runs(deployment_id):
        if run.state is not None and run.state.type == StateType.PAUSED:
            return run
    return None


def leave_one_waiting(
    server: LocalServer, deployment_id: Any, week_id: Any, report: Reporter
) -> dict[str, Any]:
    """One weekly flow run with generation on, suspended on its approval form."""
    from prefect.client.orchestration import get_client

    from episodic.flows import local
    from episodic.flows.weekly import weekly_episode

    run = _waiting_run(deployment_id)
    if run is None:
        report.line(
            f"one more weekly run of {week_id} with generation on, to wait for your approval…"
        )
        with get_client(sync_client=True) as client:
            run = client.create_flow_run_from_deployment(
                deployment_id,
                parameters={"week": str(week_id), "generate": True},
                tags=["demo-ui"],
            )
        local.execute(weekly_episode, run.id)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run.id)
    state = run.state.name if run.state is not None else "unknown"
    report.line(f"  {run.name}: {state}, waiting on its approval form")
    return {
        "url": server.url,
        "api_url": server.api_url,
        "flow_runs": f"{server.url}/runs",
        "deployments": f"{server.url}/deployments",
        "waiting_run": f"{server.url}/runs/flow-run/{run.id}",
        "waiting_flow_run_id": str(run.id),
        "waiting_flow_run_name": run.name,
        "waiting_state": state,
    }


def _assembled_cover(state: Any) -> str | None:
    """The local copy of the cover of the episode a finished weekly run assembled."""
    if not state.is_completed():
        return None
    episode_id = state.result(raise_on_failure=False)
    settings = context.settings()
    if not isinstance(episode_id, str):
        return None
    from episodic.pipeline.assembly import assemble
    from episodic.storage.episodes import EpisodeRepository

    engine = context.engine()
    pk = EpisodeRepository(engine).episode_pk(settings.pipeline, episode_id)
    if EpisodeRepository(engine).state(pk) != "assembled":
        return None
    out = settings.home_path / "demo" / episode_id  # the demo's own folder, not a user's
    assembled = assemble(engine, settings, settings.pipeline, episode_id, out=out, out_is_ours=True)
    local = assembled.get("local", {})
    cover = local.get("cover")
    return str(cover) if cover is not None else None


def wait_for_interrupt(server: LocalServer, ui: dict[str, Any], report: Reporter) -> None:
    """Print where to look, then serve the waiting run until Ctrl-C: an answer given in the
    form resumes it (Scheduled), and this process runs the rest of it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    from episodic.cli.signals import interrupts
    from episodic.flows import local
    from episodic.flows.weekly import weekly_episode

    flow_run_id = ui["waiting_flow_run_id"]
    report.line()
    report.line(f"Prefect UI: {ui['url']}")
    report.line(f"  deployments: {ui['deployments']}")
    report.line(f"  flow runs:   {ui['flow_runs']}")
    report.line(f"  waiting for your approval ({ui['waiting_flow_run_name']}):")
    report.line(f"    {ui['waiting_run']}")
    report.line("answer its form there (Resume); this process runs the rest of the flow run.")
    report.line("Ctrl-C stops the server.")
    while True:  # until Ctrl-C (`local_server` answers it)
        if interrupts.signalled.is_set():  # a Ctrl-C a library swallowed on its way
            raise KeyboardInterrupt
        time.sleep(POLL_S)
        if not server.alive():
            from episodic.core.errors import EpisodicError

            raise EpisodicError(f"the Prefect server stopped (see {server.log_path})")
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.type == StateType.SCHEDULED:
            report.line(f"answered in the UI: running the rest of {run.name}…")
            state = local.execute(weekly_episode, run.id)
            report.line(f"  {run.name}: {state.name}")
            cover = _assembled_cover(state)
            if cover is not None:
                report.line("  cover:")
                report.line(f"    {cover}")
