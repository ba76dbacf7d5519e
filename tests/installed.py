"""The distribution a team installs, built and installed as a team would: the wheel built with
the project's own uv (`make bootstrap` puts it in .tools), a fresh virtualenv holding the
locked dependencies and that wheel, and environments free of this test process's Prefect and
episodic settings. Used by the wheel tests and the team-repository end-to-end test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def uv() -> str:
    local = ROOT / ".tools" / "bin" / "uv"
    found = str(local) if local.is_file() else shutil.which("uv")
    assert found, "uv is needed to build the wheel: run `make bootstrap`"
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this test process's Prefect and episodic settings, nor the
    checkout's virtualenv on PATH."""
    checkout_bin = str(ROOT / ".venv" / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "EPISODIC_", "VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != checkout_bin
    )
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    env.update(extra)
    return env


def build_wheel(out: Path) -> Path:
    """`uv build --wheel` of this checkout into `out`; returns the wheel's path."""
    subprocess.run(
        [uv(), "build", "--wheel", "--out-dir", str(out), "--quiet", str(ROOT)],
        check=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=300,
    )
    (built,) = out.glob("episodic-*.whl")
    return built


def install_wheel(wheel: Path, root: Path) -> Path:
    """A fresh virtualenv at ``root/venv`` with the locked (non-dev) dependencies and
    `wheel`; returns the virtualenv's folder."""
    env = clean_env()
    requirements = root / "requirements.txt"
    export = ["export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "--quiet"]
    subprocess.run(
        [uv(), *export, "--output-file", str(requirements)],
        check=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    venv = root / "venv"
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
        check=True,
        env=env,
        timeout=300,
    )
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "-r", str(requirements), str(wheel)],
        check=True,
        env={**env, "VIRTUAL_ENV": str(venv)},
        timeout=600,
    )
    return venv


def team_repository(root: Path) -> Path:
    """A team's Prefect project at ``root/team`` with its own `flows` and `tasks` packages
    (the usual layout of a Prefect project: names episodic's subpackages also use)."""
    team = root / "team"
    for package in ("flows", "tasks"):
        (team / package).mkdir(parents=True)
        (team / package / "__init__.py").write_text(f"OWNER = 'team {package}'\n")
    (team / "flows" / "weekly.py").write_text("def weekly() -> str:\n    return 'theirs'\n")
    return team


def run(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`command` in `cwd` with exactly `env`, its output captured as text."""
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
