"""Running the shell blocks of one documented file, in order, on a "second machine".

A ``FileSession`` is one file's shell session in a temporary copy of the project (copied
without ``.venv``, ``.tools``, ``.episodic`` and caches; ``.venv``/``.tools``/``.git`` are
symlinks to this checkout's, so nothing is downloaded and ``make`` finds its bootstrap done).
Its environment is a fresh machine's: its own ``HOME`` (so ``~/.prefect`` is new), ``PATH``
starting with the copy's ``.venv/bin`` (an activated virtualenv), ``PYTHONPATH`` at the copy
(the shared virtualenv's editable install points at this checkout; the copy's code must be
what runs), ``PREFECT_API_URL`` at the test's Prefect server, telemetry off, no
``EPISODIC_*`` variable, so the embedded SQLite default and the fake provider.

Each block is one ``bash`` process; what carries over to the file's next block is the
working directory and the exported variables (``env -0`` at the end of each block), as in
one terminal where a reader types the blocks in order. Plain shell variables and background
processes do not carry over.

Addresses the docs write stand for the test's own: ``127.0.0.1:4200`` (Prefect's default)
is the test's server, except in a block that starts ``prefect server start`` itself, which
gets a server of its own on a free port (``PREFECT_SERVER_API_PORT``) that ``:4200`` in that
block then means. Each distinct ``postgresql+psycopg://…`` URL of a file is a fresh, empty
database on the test's PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs.blocks import Block, Command, convention_errors
from tests.e2e.stack import free_port, kill_marked

#: Carried by every process a documented block starts; whatever outlives its block is killed.
SESSION_TOKEN_VAR = "EPISODIC_DOCS_SESSION_TOKEN"
#: Seconds a command marked `# runs until stopped` must stay up (other than a server).
UP_SECONDS = float(os.environ.get("EPISODIC_DOCS_UP_S", "5"))
BLOCK_TIMEOUT_S = 300.0
_SKIP_COPY = {
    ".venv",
    ".tools",
    ".episodic",
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
}
_LINKED = (".venv", ".tools", ".git")
_DEFAULT_PREFECT = re.compile(r"(127\.0\.0\.1|localhost):4200\b")
_POSTGRES_URL = re.compile(r"postgresql(?:\+psycopg)?://[^\s\"'`]+")
_SERVER_START = re.compile(r"\bprefect\s+server\s+start\b")

_WAIT_UP = r"""
import sys, time, urllib.request
pid, kind, arg, timeout = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
def alive():
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"Z", b"X")
deadline = time.monotonic() + (float(arg) if kind == "alive" else timeout)
while time.monotonic() < deadline:
    if not alive():
        sys.exit("exited before it was up")
    if kind == "http":
        try:
            if urllib.request.urlopen(arg, timeout=2).status == 200:
                sys.exit(0)
        except OSError:
            pass
    time.sleep(0.3)
if kind == "alive" and alive():
    sys.exit(0)
sys.exit(f"not up after {timeout:.0f} s" if alive() else "exited before it was up")
"""

_PRELUDE = r"""
__doc_bg=()
__doc_bg_line=()
__doc_fail() { printf 'doc-test: %s\n' "$1" >&2; exit 86; }
__doc_end() {
  local rc=$? i pid status
  # First whether each is still up (stopping one, e.g. a server, may end another), then
  # stop them last-started first.
  for i in "${!__doc_bg[@]}"; do
    pid=${__doc_bg[$i]}
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"; status=$?
      printf 'doc-test: %s: exited %s before the block stopped it\n' \
        "${__doc_bg_line[$i]}" "$status" >&2
      rc=86
    fi
  done
  for ((i = ${#__doc_bg[@]} - 1; i >= 0; i--)); do
    pid=${__doc_bg[$i]}
    kill -INT -- "-$pid" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  env -0 > "$__DOC_STATE/env"
  pwd > "$__DOC_STATE/cwd"
  exit "$rc"
}
trap __doc_end EXIT
set -o pipefail
"""


@dataclass
class BlockResult:
    block: Block
    returncode: int
    output: str
    seconds: float

    @property
    def failures(self) -> list[str]:
        return [
            line[len("doc-test: ") :]
            for line in self.output.splitlines()
            if line.startswith("doc-test: ")
        ]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        head = "; ".join(self.failures) or f"bash exited {self.returncode}"
        tail = "\n".join(self.output.splitlines()[-80:])
        return (
            f"{self.block.id} failed: {head}\n--- block ---\n{self.block.body}\n"
            f"--- output (tail) ---\n{tail}"
        )


def copy_project(source: Path, target: Path) -> Path:
    """The project folder as a second machine's clone: files copied (mtimes kept, so
    `make` sees its bootstrap as done), the virtualenv and tools linked, no `.episodic`."""
    synced = source / ".venv" / ".synced"
    if synced.exists() and any(
        (source / name).stat().st_mtime > synced.stat().st_mtime
        for name in ("pyproject.toml", "uv.lock")
    ):
        # `make` in the copy would `uv sync` the shared .venv and install the copy into it.
        raise RuntimeError(
            f"{source}/.venv is older than pyproject.toml or uv.lock: make bootstrap"
        )
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*_SKIP_COPY), symlinks=True)
    for name in _LINKED:
        if (source / name).exists():
            (target / name).symlink_to(source / name)
    return target


@dataclass
class FileSession:
    """One documented file's blocks, run in order in one shell session."""

    path: str
    project: Path  # the original checkout
    work: Path  # this session's folder: copy/, home/, logs/, state/
    api_url: str
    postgres: Callable[[], str] | None = None  # makes a fresh empty database, returns its URL
    up_seconds: float = UP_SECONDS
    prefect_db_template: Path | None = None  # a migrated, empty Prefect database (speed only)
    results: dict[int, BlockResult] = field(default_factory=dict)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _env: dict[str, str] | None = None
    _cwd: Path | None = None
    _databases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.copy = copy_project(self.project, self.work / "copy")
        self.home = self.work / "home"
        self.logs = self.work / "logs"
        self.state = self.work / "state"
        for folder in (self.home, self.logs, self.state):
            folder.mkdir(parents=True, exist_ok=True)
        (self.state / "wait_up.py").write_text(_WAIT_UP)
        self._cwd = self.copy
        self._env = self._machine_env()

    def _machine_env(self) -> dict[str, str]:
        keep = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "CI", "USER", "LOGNAME", "SHELL")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            {
                "HOME": str(self.home),
                "PATH": f"{self.copy / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
                "VIRTUAL_ENV": str(self.copy / ".venv"),
                "PYTHONPATH": str(self.copy),
                "PREFECT_API_URL": self.api_url,
                "PREFECT_CLI_PROMPT": "false",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1",
                "COLUMNS": "160",
                SESSION_TOKEN_VAR: self.token,
            }
        )
        return env

    # -- running -----------------------------------------------------------------------------

    def run_through(self, blocks: list[Block], wanted: Block) -> BlockResult:
        """Run every not yet run block of this file up to ``wanted`` (in order); its result."""
        for block in blocks:
            if block.line not in self.results and block.runnable:
                self.results[block.line] = self._run(block)
            if block.line == wanted.line:
                return self.results[block.line]
        raise KeyError(wanted.id)

    def earlier_failures(self, wanted: Block) -> list[str]:
        return [
            r.block.id
            for line, r in sorted(self.results.items())
            if line < wanted.line and not r.ok
        ]

    def _run(self, block: Block) -> BlockResult:
        errors = convention_errors(block)
        if errors:
            text = "\n".join(f"doc-test: {e}" for e in errors)
            return BlockResult(block, 86, text, 0.0)
        script = self.state / f"block-{block.line}.sh"
        script.write_text(self.script(block))
        log = self.logs / f"block-{block.line}.log"
        assert self._env is not None and self._cwd is not None
        env = {**self._env, "__DOC_STATE": str(self.state)}
        began = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", str(script)],
                cwd=self._cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                with open(log, "ab") as tail:
                    message = f"doc-test: block still running after {BLOCK_TIMEOUT_S:.0f} s\n"
                    tail.write(message.encode())
                returncode = 124
        kill_marked(SESSION_TOKEN_VAR, self.token, grace=3.0)
        self._load_state()
        return BlockResult(
            block, returncode, log.read_text(errors="replace"), time.monotonic() - began
        )

    def _load_state(self) -> None:
        env_file, cwd_file = self.state / "env", self.state / "cwd"
        if env_file.exists():
            pairs = (item.split("=", 1) for item in env_file.read_bytes().decode().split("\0"))
            env = {p[0]: p[1] for p in pairs if len(p) == 2}
            for transient in ("PWD", "OLDPWD", "SHLVL", "_", "__DOC_STATE"):
                env.pop(transient, None)
            self._env = env
        if cwd_file.exists() and Path(cwd_file.read_text().strip()).is_dir():
            self._cwd = Path(cwd_file.read_text().strip())

    # -- the script --------------------------------------------------------------------------

    def script(self, block: Block) -> str:
        own_server = any(_SERVER_START.search(c.code) for c in block.commands())
        own_port = free_port() if own_server else None
        shared = re.sub(r"^https?://", "", self.api_url).removesuffix("/api")
        address = f"127.0.0.1:{own_port}" if own_port else shared
        parts = [_PRELUDE]
        for command in block.commands():
            text = _DEFAULT_PREFECT.sub(address, command.text)
            text = _POSTGRES_URL.sub(lambda m: self._database(m.group(0)), text)
            where = f"{block.path}:{command.line}"
            shown = shlex.quote(f"{where}: {command.text}")
            parts.append(f"printf '+ [%ss] %s\\n' \"$SECONDS\" {shown} >&2")
            if command.until_stopped:
                parts.append(self._background(command, text, where, own_port))
            else:
                parts.append(text)
                parts.append(
                    f'__doc_rc=$?; [ "$__doc_rc" -eq {command.expected_exit} ] || __doc_fail '
                    f'"{where}: exited $__doc_rc, expected {command.expected_exit}: "'
                    f"{shlex.quote(command.text)}"
                )
        return "\n".join(parts) + "\n"

    def _background(self, command: Command, text: str, where: str, own_port: int | None) -> str:
        code = Command(command.line, text).code
        log = self.logs / f"bg-{command.line}.log"
        server = _SERVER_START.search(code) is not None
        exports = (
            f"export PREFECT_SERVER_API_HOST=127.0.0.1 PREFECT_SERVER_API_PORT={own_port}; "
            if server and own_port
            else ""
        )
        seed = ""
        if server and self.prefect_db_template:
            # A first start spends ~30 s migrating an empty database; start from a migrated one.
            seed = (
                '__doc_ph="${PREFECT_HOME:-$HOME/.prefect}"; mkdir -p "$__doc_ph"; '
                '[ -e "$__doc_ph/prefect.db" ] || '
                f'cp {shlex.quote(str(self.prefect_db_template))} "$__doc_ph/prefect.db"'
            )
        if server:
            probe = f"http http://127.0.0.1:{own_port}/api/health 180"
        else:
            probe = f"alive {self.up_seconds} {self.up_seconds}"
        wait_up = f"{shlex.quote(sys.executable)} {shlex.quote(str(self.state / 'wait_up.py'))}"
        return "\n".join(
            [
                seed,
                "set -m",
                f"( {exports}{code} ) > {shlex.quote(str(log))} 2>&1 < /dev/null &",
                "__doc_pid=$!",
                "set +m",
                '__doc_bg+=("$__doc_pid")',
                f"__doc_bg_line+=({shlex.quote(where)})",
                f'{wait_up} "$__doc_pid" {probe} 2>&1 || {{ tail -n 40 {shlex.quote(str(log))}; '
                f"__doc_fail {shlex.quote(where + ': did not come up: ' + command.text)}; }}",
            ]
        )

    def created_databases(self) -> list[str]:
        return [_database_name(url) for url in self._databases.values()]

    def _database(self, documented: str) -> str:
        if documented not in self._databases:
            if self.postgres is None:
                raise RuntimeError(f"{self.path}: a block names {documented} but no PostgreSQL")
            self._databases[documented] = self.postgres()
        return self._databases[documented]


def _database_name(url: str) -> str:
    from sqlalchemy.engine import make_url

    return str(make_url(url).database)


def uses_postgres(blocks: list[Block]) -> bool:
    return any(_POSTGRES_URL.search(b.body) for b in blocks if b.runnable)
