"""A real Prefect stack for end-to-end tests: a server, process workers, and REST helpers.

Everything here talks to the stack through subprocesses and plain HTTP (httpx against
``{api_url}/...``); nothing touches the Prefect settings of the test process itself, so this
harness coexists with ``prefect_test_harness`` used elsewhere in the suite.

    with PrefectServer(tmp_path / "stack") as server:
        create_process_pool(server, "pool")
        deployment_id = deploy_flow(server, source=src, entrypoint="f.py:hello",
                                    name="d", work_pool_name="pool")
        with Worker(server, "pool", cwd=src, extra_env={"EPISODIC_TIMEZONE": "UTC"}):
            run = create_flow_run(server, deployment_id)
            wait_for_flow_run(server, run["id"])

Every process the harness starts (server, workers, flow-run processes the workers spawn, CLI
calls made with ``server.env()``) carries a marker variable in its environment; teardown kills
whatever still carries it, so nothing outlives the stack even when a test fails, and flow-run
processes that Prefect puts in their own session are found too.  Linux only (reads /proc).

APIs taking ``api`` accept a ``PrefectServer``, an API URL ("http://127.0.0.1:PORT/api"), or an
environment mapping that contains ``PREFECT_API_URL``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from tests.fast_loop import no_servers_in_the_fast_loop

#: Marker carried by every process of one stack (server, workers, flow runs, CLI calls).
STACK_TOKEN_VAR = "EPISODIC_E2E_STACK_TOKEN"
#: Marker carried by one worker and the flow-run processes it spawns.
WORKER_TOKEN_VAR = "EPISODIC_E2E_WORKER_TOKEN"

#: Terminal Prefect state types.
TERMINAL_STATE_TYPES = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})

_TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


class StackError(RuntimeError):
    """A process of the stack failed to start, died, or a wait timed out."""


# --------------------------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------------------------

_LIVE: dict[int, _Stoppable] = {}
_LIVE_LOCK = threading.Lock()


class _Stoppable:
    def stop(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


def _register(obj: _Stoppable) -> None:
    with _LIVE_LOCK:
        _LIVE[id(obj)] = obj


def _unregister(obj: _Stoppable) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(obj), None)


def stop_all() -> None:
    """Stop every server and worker of this module still running (also runs at exit)."""
    with _LIVE_LOCK:
        objs = list(_LIVE.values())
    # Workers first, servers last.
    objs.sort(key=lambda o: isinstance(o, PrefectServer))
    for obj in objs:
        with contextlib.suppress(Exception):
            obj.stop()


atexit.register(stop_all)


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host`` (bind port 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # state is the field after the parenthesised command name
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def pids_with_env(var: str, value: str) -> list[int]:
    """PIDs (other than this process) whose initial environment has ``var=value``."""
    needle = f"{var}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    remaining = [p for p in pids if _pid_alive(p)]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.1)
        remaining = [p for p in remaining if _pid_alive(p)]
    return remaining


def kill_marked(var: str, value: str, grace: float = 5.0, exclude: Iterable[int] = ()) -> list[int]:
    """SIGTERM every process carrying ``var=value``, SIGKILL those left after ``grace``.

    Returns the PIDs that were found.  Repeats the scan so children spawned during the
    shutdown are caught as well.
    """
    excluded = set(exclude)
    seen: set[int] = set()
    for _ in range(3):
        pids = [p for p in pids_with_env(var, value) if p not in excluded and _pid_alive(p)]
        if not pids:
            break
        seen.update(pids)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        for pid in _wait_gone(pids, grace):
            _signal(pid, signal.SIGKILL)
        _wait_gone(pids, 5.0)
    return sorted(seen)


def _terminate_popen(proc: subprocess.Popen[Any], grace: float) -> int | None:
    """SIGTERM the process group led by ``proc``; SIGKILL the group after ``grace``."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    # Whatever else is still in the group (the leader is gone by now).
    _signal_group(proc.pid, signal.SIGKILL)
    return proc.poll()


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# environments
# --------------------------------------------------------------------------------------------


def base_env() -> dict[str, str]:
    """``os.environ`` without any ``PREFECT_*`` variable (the test process sets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}


def merged_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base_env()`` overlaid with ``env`` (a partial or full environment)."""
    merged = base_env()
    if env:
        merged.update({k: str(v) for k, v in env.items()})
    return merged


def api_url_of(api: PrefectServer | str | Mapping[str, str]) -> str:
    if isinstance(api, PrefectServer):
        return api.api_url
    if isinstance(api, str):
        return api.rstrip("/")
    try:
        return str(api["PREFECT_API_URL"]).rstrip("/")
    except KeyError:
        raise ValueError("environment has no PREFECT_API_URL") from None


# --------------------------------------------------------------------------------------------
# server
# --------------------------------------------------------------------------------------------


class PrefectServer(_Stoppable):
    """``prefect server start`` on a free port, with its own PREFECT_HOME and SQLite database.

    ``tmp_dir`` holds ``server-home/`` (PREFECT_HOME and prefect.db of the server),
    ``client-home/`` (PREFECT_HOME of clients and workers), ``server.log`` and ``workers/``.
    Without ``tmp_dir`` a temporary directory is created and removed on exit.
    ``database_url`` replaces the SQLite file, e.g.
    "postgresql+asyncpg://postgres@127.0.0.1:5432/some_empty_db" (the harness neither
    creates nor drops it).  ``settings`` are extra PREFECT_* variables for the server only.
    """

    def __init__(
        self,
        tmp_dir: Path | str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        ui: bool = True,
        scheduler_loop_seconds: float = 5.0,
        late_runs: bool = True,
        database_url: str | None = None,
        settings: Mapping[str, str] | None = None,
        startup_timeout: float = 120.0,
        stop_grace: float = 15.0,
    ) -> None:
        self._owns_tmp = tmp_dir is None
        self.tmp_dir = Path(tmp_dir) if tmp_dir else Path(tempfile.mkdtemp(prefix="e2e-prefect-"))
        self.host = host
        self._requested_port = port
        self.port: int = 0
        self.ui = ui
        self.scheduler_loop_seconds = scheduler_loop_seconds
        self.late_runs = late_runs
        self.database_url = database_url
        self.settings = dict(settings or {})
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.token = uuid.uuid4().hex
        self.server_home = self.tmp_dir / "server-home"
        self.client_home = self.tmp_dir / "client-home"
        self.log_path = self.tmp_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None
        self.stopped = False

    # -- urls / env ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    @property
    def ui_url(self) -> str:
        return self.base_url

    @property
    def database_path(self) -> Path:
        return self.server_home / "prefect.db"

    def client_vars(self) -> dict[str, str]:
        """Only the variables a Prefect client/worker needs to talk to this server."""
        return {
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(self.client_home),
            "PREFECT_CLI_PROMPT": "false",
            **_TELEMETRY_OFF,
            STACK_TOKEN_VAR: self.token,
        }

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Full environment for a client/worker subprocess: ``os.environ`` minus PREFECT_*,
        plus PREFECT_API_URL, PREFECT_HOME (client home), telemetry off, the stack marker,
        plus ``extra``."""
        env = merged_env(self.client_vars())
        if extra:
            env.update({k: str(v) for k, v in extra.items()})
        return env

    def _server_env(self) -> dict[str, str]:
        env = merged_env(
            {
                "PREFECT_HOME": str(self.server_home),
                "PREFECT_SERVER_DATABASE_CONNECTION_URL": (
                    self.database_url or f"sqlite+aiosqlite:///{self.database_path}"
                ),
                # Without these the UI is told (GET /ui-settings) that the API lives on the
                # default port 4200: --host/--port alone do not reach the UI settings.
                "PREFECT_SERVER_API_HOST": self.host,
                "PREFECT_SERVER_API_PORT": str(self.port),
                "PREFECT_SERVER_UI_API_URL": self.api_url,
                "PREFECT_SERVER_UI_ENABLED": "true" if self.ui else "false",
                "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": str(self.scheduler_loop_seconds),
                "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "true" if self.late_runs else "false",
                # 503s (SQLite "database is locked") are logged, for post-mortems.
                "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",
                "PREFECT_CLI_PROMPT": "false",
                **_TELEMETRY_OFF,
                STACK_TOKEN_VAR: self.token,
            }
        )
        env.update(self.settings)
        return env

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        if self.proc is not None:
            raise StackError("server already started")
        no_servers_in_the_fast_loop("a Prefect server")
        for d in (self.tmp_dir, self.server_home, self.client_home):
            d.mkdir(parents=True, exist_ok=True)
        _register(self)
        try:
            attempts = 1 if self._requested_port else 3
            for attempt in range(attempts):
                self.port = self._requested_port or free_port(self.host)
                if self._start_once(last=attempt == attempts - 1):
                    return self
            raise AssertionError("unreachable")
        except BaseException:
            self.stop()
            raise

    def _start_once(self, *, last: bool) -> bool:
        began = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--analytics-off",
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {' '.join(cmd)}\n".encode())
            log.flush()
            # cwd = tmp dir: no prefect.toml/.env/pyproject.toml of the repo is picked up.
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.tmp_dir,
                env=self._server_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = began + self.startup_timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                rc = self.proc.poll()
                if rc is not None:
                    log_text = _tail(self.log_path, 200)
                    self.proc = None
                    if not last and "already in use" in log_text.lower():
                        return False  # lost a race for the port; try another one
                    raise StackError(
                        f"prefect server exited with {rc} during startup "
                        f"(log {self.log_path}):\n{_tail(self.log_path)}"
                    )
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        self.started_in = time.monotonic() - began
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise StackError(
            f"prefect server not healthy after {self.startup_timeout:.0f}s "
            f"(log {self.log_path}):\n{_tail(self.log_path)}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def stop(self) -> None:
        """Kill every process of the stack (workers, flow runs, CLIs), then the server.
        Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        try:
            server_pid = self.proc.pid if self.proc else -1
            kill_marked(STACK_TOKEN_VAR, self.token, grace=5.0, exclude=[server_pid])
            if self.proc is not None:
                _terminate_popen(self.proc, self.stop_grace)
            kill_marked(STACK_TOKEN_VAR, self.token, grace=2.0)
        finally:
            _unregister(self)
            if self._owns_tmp:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------------


class Worker(_Stoppable):
    """``prefect worker start --pool POOL --type process`` in ``cwd``, output to a log file.

    ``env``: a ``PrefectServer`` (its ``env()`` is used) or a full/partial environment with
    PREFECT_API_URL.  ``extra_env`` is added on top (EPISODIC_DATABASE_URL, ...).  Flow-run
    processes inherit the worker's environment.  As a context manager the worker is started
    and awaited ONLINE (it has sent a heartbeat to the server), and stopped on exit.
    ``python``: the interpreter the worker runs with (default: this process's), e.g. another
    project copy's ``.venv/bin/python`` for a worker "on another machine". ``inherit=False``:
    a mapping ``env`` is the whole environment (nothing of this process's), as for a worker
    of an installed wheel that must not see this checkout's settings.
    """

    def __init__(
        self,
        env: PrefectServer | Mapping[str, str],
        pool: str,
        *,
        cwd: Path | str,
        extra_env: Mapping[str, str] | None = None,
        limit: int | None = None,
        name: str | None = None,
        work_queues: Sequence[str] = (),
        worker_type: str = "process",
        log_path: Path | str | None = None,
        query_seconds: float = 1.0,
        heartbeat_seconds: float = 5.0,
        stop_grace: float = 10.0,
        python: Path | str | None = None,
        inherit: bool = True,
    ) -> None:
        self.python = str(python or sys.executable)
        self.pool = pool
        self.cwd = Path(cwd)
        self.limit = limit
        self.name = name or f"e2e-worker-{uuid.uuid4().hex[:8]}"
        self.work_queues = list(work_queues)
        self.worker_type = worker_type
        self.stop_grace = stop_grace
        self.token = uuid.uuid4().hex
        if isinstance(env, PrefectServer):
            base = env.env()
            log_dir = env.tmp_dir / "workers"
        else:
            base = merged_env(env) if inherit else {k: str(v) for k, v in env.items()}
            log_dir = Path(tempfile.mkdtemp(prefix="e2e-worker-"))
        self.api_url = api_url_of(base)
        self.log_path = Path(log_path) if log_path else log_dir / f"{self.name}.log"
        self._env = {
            **base,
            "PREFECT_WORKER_QUERY_SECONDS": str(query_seconds),
            "PREFECT_WORKER_HEARTBEAT_SECONDS": str(heartbeat_seconds),
            **{k: str(v) for k, v in (extra_env or {}).items()},
            WORKER_TOKEN_VAR: self.token,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.stopped = False

    @property
    def env(self) -> dict[str, str]:
        return dict(self._env)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            self.pool,
            "--type",
            self.worker_type,
            "--name",
            self.name,
            "--install-policy",
            "never",
        ]
        if self.limit is not None:
            cmd += ["--limit", str(self.limit)]
        for queue in self.work_queues:
            cmd += ["--work-queue", queue]
        return cmd

    def start(self) -> Self:
        if self.proc is not None:
            raise StackError(f"worker {self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _register(self)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.command(),
                    cwd=self.cwd,
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            _unregister(self)
            raise
        return self

    def wait_online(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the server lists this worker as ONLINE; returns the worker record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise StackError(
                    f"worker {self.name} exited with {self.proc and self.proc.poll()} "
                    f"before coming online (log {self.log_path}):\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError, StackError):
                workers = api_request(
                    self.api_url,
                    "POST",
                    f"/work_pools/{self.pool}/workers/filter",
                    json={"limit": 200},  # WorkerFilter has no name filter in 3.9.1
                    expected=(200, 404),
                )
                for worker in workers or []:
                    if worker.get("name") == self.name and worker.get("status") == "ONLINE":
                        return dict(worker)
            time.sleep(0.5)
        raise StackError(
            f"worker {self.name} not ONLINE after {timeout:.0f}s "
            f"(log {self.log_path}):\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the worker (its process group), SIGKILL after ``grace``; then kill any
        flow-run process it left behind.  Returns the worker's exit code.  Idempotent."""
        if self.stopped:
            return self.returncode
        self.stopped = True
        grace = self.stop_grace if grace is None else grace
        try:
            if self.proc is not None:
                self.returncode = _terminate_popen(self.proc, grace)
            kill_marked(WORKER_TOKEN_VAR, self.token, grace=min(grace, 5.0))
        finally:
            _unregister(self)
        return self.returncode

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_online()
        except BaseException:
            self.stop(grace=2.0)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _program(program: str | Sequence[str]) -> list[str]:
    if not isinstance(program, str):
        return list(program)
    if program == "prefect":
        return [sys.executable, "-m", "prefect"]
    beside = Path(sys.executable).parent / program
    if beside.exists():
        return [str(beside)]
    found = shutil.which(program)
    if not found:
        raise StackError(f"program {program!r} not found")
    return [found]


def run_cli(
    args: Sequence[str],
    env: PrefectServer | Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    *,
    program: str | Sequence[str] = "prefect",
    timeout: float = 120.0,
    check: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``prefect ARGS`` (or ``program ARGS``, e.g. program="episodic") and capture output.

    ``env`` is overlaid on ``os.environ`` minus PREFECT_*.  On timeout the whole process group
    is killed and ``subprocess.TimeoutExpired`` is raised; with ``check`` a non-zero exit
    raises ``StackError`` showing stdout and stderr.
    """
    full_env = env.env() if isinstance(env, PrefectServer) else merged_env(env)
    cmd = [*_program(program), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr) from None
    except BaseException:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    # Anything the command left running in its group.
    _signal_group(proc.pid, signal.SIGKILL)
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise StackError(
            f"{' '.join(cmd)} exited with {result.returncode}\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )
    return result


# --------------------------------------------------------------------------------------------
# REST helpers
# --------------------------------------------------------------------------------------------


#: Responses the server sends for transient trouble; with SQLite under concurrent writers
#: (workers, flow runs, services) Prefect answers 503 for "database is locked".
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


def api_request(
    api: PrefectServer | str | Mapping[str, str],
    method: str,
    path: str,
    *,
    json: Any = None,
    expected: Iterable[int] = (200, 201, 204),
    timeout: float = 30.0,
    retries: int = 8,
) -> Any:
    """One REST call against the server; returns the decoded JSON body (None if empty).

    Retries (like Prefect's own client) on 429/502/503/504 and on connection errors, with
    exponential backoff (~25 s in all); a failed write was rolled back, so a retry is safe.
    """
    url = f"{api_url_of(api)}/{path.lstrip('/')}"
    wanted = set(expected)
    with httpx.Client(timeout=timeout) as client:
        for attempt in range(retries + 1):
            last = attempt == retries
            try:
                response = client.request(method, url, json=json)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                if last:
                    raise
            except httpx.ReadTimeout:  # a busy server: only a read is safe to ask again
                if last or method.upper() != "GET":
                    raise
            else:
                if response.status_code in wanted or response.status_code not in RETRYABLE_STATUS:
                    break
                if last:
                    break
            time.sleep(min(0.25 * 2**attempt, 5.0))
    if response.status_code not in wanted:
        raise StackError(f"{method} {url} -> {response.status_code}: {response.text[:2000]}")
    if not response.content:
        return None
    return response.json()


def create_process_pool(
    api: PrefectServer | str | Mapping[str, str],
    name: str,
    *,
    concurrency_limit: int | None = None,
) -> dict[str, Any]:
    """Create a ``process`` work pool with Prefect's default job template; if a pool of that
    name exists, return it unchanged (idempotent)."""
    existing = api_request(api, "GET", f"/work_pools/{name}", expected=(200, 404))
    if existing and existing.get("name") == name:
        return dict(existing)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from prefect.workers.process import ProcessWorker

        template = ProcessWorker.get_default_base_job_template()
    body: dict[str, Any] = {"name": name, "type": "process", "base_job_template": template}
    if concurrency_limit is not None:
        body["concurrency_limit"] = concurrency_limit
    created = api_request(api, "POST", "/work_pools/", json=body, expected=(200, 201, 409))
    if created and created.get("name") == name:
        return dict(created)
    return dict(api_request(api, "GET", f"/work_pools/{name}"))  # lost a creation race


_DEPLOY_SCRIPT = r"""
import json, sys
specs = json.loads(sys.argv[1])
from prefect import flow
from prefect.schedules import Cron, Interval
for spec in specs:
    schedules = []
    if spec.get("cron"):
        schedules.append(Cron(spec["cron"], timezone=spec.get("timezone")))
    if spec.get("interval") is not None:
        schedules.append(Interval(spec["interval"], timezone=spec.get("timezone")))
    f = flow.from_source(source=spec["source"], entrypoint=spec["entrypoint"])
    kwargs = {k: spec[k] for k in ("parameters", "job_variables", "tags", "paused",
                                    "work_queue_name", "concurrency_limit")
              if spec.get(k) is not None}
    if schedules:
        kwargs["schedules"] = schedules
    deployment_id = f.deploy(name=spec["name"], work_pool_name=spec["work_pool_name"],
                             build=False, push=False, print_next_steps=False,
                             ignore_warnings=True, **kwargs)
    print("E2E_DEPLOYMENT_ID=" + str(deployment_id), flush=True)
"""


def deploy_flow(
    env: PrefectServer | Mapping[str, str],
    *,
    source: Path | str,
    entrypoint: str,
    name: str,
    work_pool_name: str,
    cwd: Path | str | None = None,
    parameters: Mapping[str, Any] | None = None,
    job_variables: Mapping[str, Any] | None = None,
    cron: str | None = None,
    interval: float | None = None,
    timezone: str | None = None,
    paused: bool | None = None,
    tags: Sequence[str] | None = None,
    work_queue_name: str | None = None,
    concurrency_limit: int | None = None,
    timeout: float = 180.0,
) -> str:
    """``flow.from_source(source, entrypoint).deploy(...)`` in a subprocess against the
    server; returns the deployment id.  The flow module is imported in that subprocess (with
    ``env``), so its imports must resolve there; ``cwd`` defaults to ``source``."""
    spec = {
        "source": str(source),
        "entrypoint": entrypoint,
        "name": name,
        "work_pool_name": work_pool_name,
        "parameters": dict(parameters) if parameters is not None else None,
        "job_variables": dict(job_variables) if job_variables is not None else None,
        "cron": cron,
        "interval": interval,
        "timezone": timezone,
        "paused": paused,
        "tags": list(tags) if tags is not None else None,
        "work_queue_name": work_queue_name,
        "concurrency_limit": concurrency_limit,
    }
    (deployment_id,) = deploy_flows(env, [spec], cwd=cwd or source, timeout=timeout)
    return deployment_id


def deploy_flows(
    env: PrefectServer | Mapping[str, str],
    specs: Sequence[Mapping[str, Any]],
    *,
    cwd: Path | str,
    timeout: float = 180.0,
) -> list[str]:
    """Several `deploy_flow`s in one subprocess (Prefect and the flows imported once, not
    once per deployment); each spec holds `deploy_flow`'s keyword arguments (``source``,
    ``entrypoint``, ``name``, ``work_pool_name`` required). Returns the deployment ids in
    the order of ``specs``."""
    optional = (
        "parameters",
        "job_variables",
        "cron",
        "interval",
        "timezone",
        "paused",
        "tags",
        "work_queue_name",
        "concurrency_limit",
    )
    full = [
        {**{k: spec.get(k) for k in optional}, **spec, "source": str(spec["source"])}
        for spec in specs
    ]
    result = run_cli(
        ["-c", _DEPLOY_SCRIPT, json.dumps(full)],
        env,
        cwd,
        program=[sys.executable],
        timeout=timeout,
        check=True,
    )
    ids = [
        line.split("=", 1)[1].strip()
        for line in result.stdout.splitlines()
        if line.startswith("E2E_DEPLOYMENT_ID=")
    ]
    if len(ids) != len(full):
        raise StackError(
            f"deploy printed {len(ids)} deployment ids for {len(full)} deployments:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return ids


def read_deployment(
    api: PrefectServer | str | Mapping[str, str], flow_name: str, deployment_name: str
) -> dict[str, Any]:
    return dict(api_request(api, "GET", f"/deployments/name/{flow_name}/{deployment_name}"))


def create_flow_run(
    api: PrefectServer | str | Mapping[str, str],
    deployment_id: str,
    *,
    parameters: Mapping[str, Any] | None = None,
    name: str | None = None,
    tags: Sequence[str] | None = None,
    scheduled_time: dt.datetime | None = None,
) -> dict[str, Any]:
    """POST /deployments/{id}/create_flow_run: a run Scheduled for now (or ``scheduled_time``)."""
    body: dict[str, Any] = {}
    if parameters is not None:
        body["parameters"] = dict(parameters)
    if name is not None:
        body["name"] = name
    if tags is not None:
        body["tags"] = list(tags)
    if scheduled_time is not None:
        body["state"] = {
            "type": "SCHEDULED",
            "name": "Scheduled",
            "state_details": {"scheduled_time": scheduled_time.isoformat()},
        }
    return dict(
        api_request(api, "POST", f"/deployments/{deployment_id}/create_flow_run", json=body)
    )


def read_flow_run(api: PrefectServer | str | Mapping[str, str], flow_run_id: str) -> dict[str, Any]:
    return dict(api_request(api, "GET", f"/flow_runs/{flow_run_id}"))


def _state_matches(run: Mapping[str, Any], wanted: set[str]) -> bool:
    state_type = (run.get("state_type") or "").upper()
    state_name = (run.get("state_name") or "").lower()
    return state_type in {w.upper() for w in wanted} or state_name in {w.lower() for w in wanted}


def wait_for_flow_run(
    api: PrefectServer | str | Mapping[str, str],
    flow_run_id: str,
    states: Iterable[str] = ("COMPLETED",),
    timeout: float = 120.0,
    *,
    poll: float = 0.5,
    fail_fast: bool = True,
) -> dict[str, Any]:
    """Poll GET /flow_runs/{id} until its state type (COMPLETED, ...) or state name
    (Completed, Late, AwaitingRetry, ...) is in ``states``; returns the flow run.  With
    ``fail_fast``, reaching another terminal state raises at once."""
    wanted = set(states)
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while True:
        with contextlib.suppress(httpx.TransportError):
            run = read_flow_run(api, flow_run_id)
            if _state_matches(run, wanted):
                return run
            if fail_fast and run.get("state_type") in TERMINAL_STATE_TYPES:
                raise StackError(
                    f"flow run {flow_run_id} ended {run.get('state_type')}/"
                    f"{run.get('state_name')}, wanted {sorted(set(states))}: "
                    f"{(run.get('state') or {}).get('message')}"
                )
        if time.monotonic() >= deadline:
            raise StackError(
                f"flow run {flow_run_id} still {run.get('state_type')}/{run.get('state_name')} "
                f"after {timeout:.0f}s, wanted {sorted(set(states))}"
            )
        time.sleep(poll)


def wait_for_flow_runs(
    api: PrefectServer | str | Mapping[str, str],
    flow_run_ids: Iterable[str],
    states: Iterable[str] = ("COMPLETED",),
    timeout: float = 120.0,
    *,
    poll: float = 0.5,
    fail_fast: bool = True,
) -> list[dict[str, Any]]:
    """``wait_for_flow_run`` for several runs under one overall deadline."""
    deadline = time.monotonic() + timeout
    states = list(states)
    return [
        wait_for_flow_run(
            api, i, states, max(0.0, deadline - time.monotonic()), poll=poll, fail_fast=fail_fast
        )
        for i in flow_run_ids
    ]


def flow_runs_of_deployment(
    api: PrefectServer | str | Mapping[str, str],
    deployment_id: str,
    *,
    state_types: Iterable[str] | None = None,
    auto_scheduled: bool | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """POST /flow_runs/filter: runs of one deployment, oldest expected start first."""
    flow_runs: dict[str, Any] = {"deployment_id": {"any_": [str(deployment_id)]}}
    if state_types is not None:
        flow_runs["state"] = {"type": {"any_": [s.upper() for s in state_types]}}
    body = {"flow_runs": flow_runs, "sort": "EXPECTED_START_TIME_ASC", "limit": limit}
    runs = [dict(r) for r in api_request(api, "POST", "/flow_runs/filter", json=body)]
    if auto_scheduled is not None:
        runs = [r for r in runs if bool(r.get("auto_scheduled")) == auto_scheduled]
    return runs


def trigger_scheduler(
    api: PrefectServer | str | Mapping[str, str],
    deployment_id: str,
    *,
    start_time: dt.datetime | None = None,
    end_time: dt.datetime | None = None,
    min_time: dt.timedelta | None = None,
    min_runs: int | None = None,
    max_runs: int | None = None,
) -> list[dict[str, Any]]:
    """POST /deployments/{id}/schedule: make the server create the scheduled runs of the
    deployment's active schedules now instead of waiting for the scheduler loop.

    Defaults are the scheduler's (from now, min 3 / max 100 runs, 1 h .. 100 days ahead);
    pass ``start_time``/``end_time`` in the past for a backfill (those runs come out Late
    but workers still pick them up).  Idempotent: a slot already scheduled is not
    duplicated.  Returns all auto-scheduled runs of the deployment afterwards."""
    body: dict[str, Any] = {}
    if start_time is not None:
        body["start_time"] = start_time.isoformat()
    if end_time is not None:
        body["end_time"] = end_time.isoformat()
    if min_time is not None:
        body["min_time"] = min_time.total_seconds()
    if min_runs is not None:
        body["min_runs"] = min_runs
    if max_runs is not None:
        body["max_runs"] = max_runs
    api_request(api, "POST", f"/deployments/{deployment_id}/schedule", json=body)
    return flow_runs_of_deployment(api, deployment_id, auto_scheduled=True)
