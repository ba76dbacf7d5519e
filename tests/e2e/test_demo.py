"""`episodic demo --ui` as a user runs it: a real local Prefect server that stays up
after the demo, one weekly run suspended on its approval form with the images, the UI's
addresses printed in full (a 100-column terminal setting and a pipe), and Ctrl-C stopping the
server: one line, no traceback, the server's process gone and its port closed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import merged_env, pids_with_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
EPISODIC = Path(sys.executable).with_name("episodic")
WEEK = "2026-W49"
MARKER = "EPISODIC_DEMO_UI_TEST"


def _api(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{url}/api{path}",
        data=data,
        method="POST" if data is not None else "GET",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # localhost
        return json.loads(response.read())


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_demo_ui_leaves_a_run_waiting_for_approval_and_ctrl_c_stops_the_server(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    token = str(os.getpid())
    env = merged_env(
        {
            "EPISODIC_HOME": str(home),
            "EPISODIC_DATABASE_URL": f"sqlite:///{home / 'episodic.db'}",
            "COLUMNS": "100",
            MARKER: token,
        }
    )
    proc = subprocess.Popen(
        [str(EPISODIC), "demo", "--ui", "--week", WEEK],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops the server"):
                ready.set()
        ready.set()  # the command ended before it (a failure: the asserts say which)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(timeout=400), "\n".join(lines[-40:])
        assert proc.poll() is None, proc.communicate(timeout=10)
        (url,) = [line.split(": ", 1)[1] for line in lines if line.startswith("Prefect UI: ")]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        port = int(url.rsplit(":", 1)[1])

        # The deployment and the slots' runs are on this server, not an ephemeral one.
        deployments = _api(url, "/deployments/filter", {})
        assert [d["name"] for d in deployments] == ["demo-twice-weekly"]
        runs = _api(url, "/flow_runs/filter", {})
        assert {r["name"] for r in runs if r["state_type"] == "COMPLETED"} >= {
            f"weekly {WEEK}-0 · Mon 09:00 UTC",
            f"weekly {WEEK}-1 · Thu 09:00 UTC",
        }
        (waiting,) = [r for r in runs if r["state_type"] == "PAUSED"]
        assert waiting["state"]["name"] == "Suspended"
        assert waiting["name"] == f"weekly {WEEK}-2"
        # Its page, printed in full on a line of its own.
        assert f"    {url}/runs/flow-run/{waiting['id']}" in lines
        keyset = waiting["state"]["state_details"]["run_input_keyset"]
        schema = _api(url, f"/flow_runs/{waiting['id']}/input/{keyset['schema']}")
        assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
        description = _api(url, f"/flow_runs/{waiting['id']}/input/{keyset['description']}")
        assert description.count("](data:image/") == 14  # the images themselves, inline

        # The covers to open: full paths on lines of their own, whatever the width.
        for episode in (f"{WEEK}-0", f"{WEEK}-1"):
            cover = home / "demo" / episode / "cover.png"
            assert f"    {cover}" in lines
            assert cover.read_bytes().startswith(b"\x89PNG")
            assert f"    {cover.with_name('manifest.json')}" in lines
        # An answer given in the form (the UI's Resume) is carried out by the waiting command.
        answered = len(lines)
        _api(
            url,
            f"/flow_runs/{waiting['id']}/resume",
            {"run_input": {"decision": "approve", "reviewer": "a tester"}},
        )
        cover = home / "demo" / f"{WEEK}-2" / "cover.png"
        deadline = time.monotonic() + 120
        while f"    {cover}" not in lines[answered:] and time.monotonic() < deadline:
            assert proc.poll() is None, "\n".join(lines[answered:])
            time.sleep(0.5)
        assert lines[answered:] == [
            f"answered in the UI: running the rest of weekly {WEEK}-2…",
            f"  weekly {WEEK}-2: Completed",
            "  cover:",
            f"    {cover}",
        ]
        assert cover.is_file()
        assert _api(url, f"/flow_runs/{waiting['id']}")["state_type"] == "COMPLETED"

        server_pids = [p for p in pids_with_env(MARKER, token) if p != proc.pid]
        assert server_pids, "the Prefect server runs as a child process"

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) in (0, 130)
        reader.join(timeout=10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert stderr == f"interrupted: the Prefect server on {url} is stopped\n"
        assert not _port_open(port)
        assert [p for p in server_pids if Path(f"/proc/{p}").exists()] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid in pids_with_env(MARKER, token):  # whatever outlived a failed run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_demo_tells_its_story_line_by_line_and_prints_full_paths(tmp_path: Path) -> None:
    """`make demo` in a 100-column terminal setting, through a pipe: one line per step (no
    Prefect log lines), a summary, the covers' and manifests' full paths on lines of their own,
    what to try next; then `--json` (a rerun: nothing paid again) still one JSON document."""
    home = tmp_path / "home"
    env = merged_env(
        {
            "EPISODIC_HOME": str(home),
            "EPISODIC_DATABASE_URL": f"sqlite:///{home / 'episodic.db'}",
            "COLUMNS": "100",
        }
    )
    human = subprocess.run(
        [str(EPISODIC), "demo", "--week", WEEK],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert human.returncode == 0, human.stdout + human.stderr
    assert "Traceback" not in human.stderr and " | INFO " not in human.stdout + human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith(f"episodic demo: the weekly flow for {WEEK}, pipeline weekly")
    for step in (
        f"  slot 1 (Mon 2026-11-30 09:00 UTC, flow run completed): {WEEK}-0",
        f"  slot 2 (Thu 2026-12-03 09:00 UTC, flow run completed): {WEEK}-1",
        f"  retry of slot 1 (Mon 2026-11-30 09:00 UTC, flow run completed): {WEEK}-0 again",
        f"generating {WEEK}-0: 14 images (fake provider)…",
        "  0 new paid calls, 14 skipped (never pays twice)",
        "episodic check --all: clean",
        f"{WEEK}-0  assembled           14  0.56 USD",
    ):
        assert step in lines, step
    for episode in (f"{WEEK}-0", f"{WEEK}-1"):
        cover = home / "demo" / episode / "cover.png"
        assert f"    {cover}" in lines
        assert cover.read_bytes().startswith(b"\x89PNG")
        manifest = json.loads(cover.with_name("manifest.json").read_text())
        assert f"    {cover.with_name('manifest.json')}" in lines
        assert manifest["episode_id"] == episode
    tried = [line.strip() for line in lines[lines.index("try next:") + 1 :]]
    commands = ["episodic demo --ui", f"episodic preview {WEEK}-0", "episodic spend"]
    commands += ["episodic check --all", "episodic init", "docs/providers.md"]
    assert len(tried) == len(commands)
    # `episodic` as this shell finds it, else the path that ran it (.venv/bin/episodic)
    ran = str(EPISODIC.relative_to(PROJECT))
    typed = [line.split("  ")[0].replace(ran, "episodic", 1) for line in tried]
    assert typed == commands

    again = subprocess.run(
        [str(EPISODIC), "demo", "--week", WEEK, "--json"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert again.returncode == 0, again.stderr
    story = json.loads(again.stdout)
    assert [s["paid_submissions"] for s in story["steps"]] == [0, 0, 0]
    assert [e["cover_path"] for e in story["episodes"]] == [
        str(home / "demo" / f"{WEEK}-{n}" / "cover.png") for n in (0, 1)
    ]
    # What the demo leaves in the state folder is the project's: `make clean-state` removes it.
    removed = subprocess.run(
        [str(EPISODIC), "state", "remove", "--yes", "--including-paid"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert removed.returncode == 0, removed.stderr
    assert not home.exists()
