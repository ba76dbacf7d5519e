"""Inputs from outside, at their boundary: each is a one-line error
with exit 2 or is accepted correctly, never exit 1 or a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.generation import provider_log, write_playlist

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _one_line_refusal(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@SQLITE_ONLY
def test_markup_in_an_allocation_key_is_shown_as_text(cli: Cli, database_url: str) -> None:
    assert cli("allocate", "--key", "[/x]", "--week", "2026-W32").returncode == 0
    assert cli("allocate", "--key", "[bold red]boom", "--week", "2026-W32").returncode == 0
    assert cli("allocate", "--key", "x:smile:y", "--week", "2026-W32").returncode == 0
    listed = cli("episodes", "list")
    assert listed.returncode == 0, listed.stderr
    assert "[/x]" in listed.stdout and "[bold red]boom" in listed.stdout
    assert "x:smile:y" in listed.stdout
    shown = cli("episodes", "show", "2026-W32-0")
    assert shown.returncode == 0 and "[/x]" in shown.stdout


@SQLITE_ONLY
def test_amounts_are_plain_ascii_decimals(cli: Cli, database_url: str, tmp_path: Path) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    for bad in ("1e999999999", "\u0661\u0662", "1E3", "nan"):
        _one_line_refusal(cli("generate", "2026-W32-0", "--max-cost", bad), "invalid amount")
    assert json.loads(cli("runs", "list", "--json").stdout) == []


@SQLITE_ONLY
def test_reference_assets_stay_inside_the_playlist_folder(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    folder = tmp_path / "pl"
    playlist = write_playlist(folder, ["a"], references={"style.txt": "ok"})
    data = yaml.safe_load(playlist.read_text())
    (tmp_path / "secret.txt").write_text("not yours")
    (folder / "link.txt").symlink_to(tmp_path / "secret.txt")
    for name, needle in (
        ("../../../../etc/hostname", "outside the playlist"),
        ("../secret.txt", "outside the playlist"),
        ("link.txt", "outside the playlist"),
        ("/etc/hostname", "outside the playlist"),
        ("a\x00b", "without NUL"),
        ("x" * 6000, "at most 1024"),
    ):
        data["reference_assets"] = [name]
        playlist.write_text(yaml.safe_dump(data))
        _one_line_refusal(cli("plan", "2026-W32-0", "--playlist", str(playlist)), needle)
    _one_line_refusal(cli("plan", "2026-W32-0", "--playlist", "/dev/zero"), "regular file")
    data["reference_assets"] = ["style.txt"]
    playlist.write_text(yaml.safe_dump(data))
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0


def test_text_that_no_column_takes_is_refused_at_plan_time(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """Refused by `plan` on both backends, not at `generate` on Postgres."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    cases = [
        (write_playlist(tmp_path / "nul", ["a\x00b"]), "control characters"),
        (write_playlist(tmp_path / "esc", ["a\x1b[2Jb"]), "control characters"),
        (write_playlist(tmp_path / "long", ["x" * 300], prompt="{title}" * 40), "at most 8000"),
        (write_playlist(tmp_path / "spec", ["a"], prompt="{title!r:>99999999999}"), "spec"),
    ]
    seeded = write_playlist(tmp_path / "seed", ["a"])
    data = yaml.safe_load(seeded.read_text())
    data["items"][0]["seed"] = True
    seeded.write_text(yaml.safe_dump(data))
    cases.append((seeded, "seed"))
    for playlist, needle in cases:
        _one_line_refusal(cli("plan", "2026-W32-0", "--playlist", str(playlist)), needle)
    assert "no plan" in cli("generate", "2026-W32-0").stderr


@SQLITE_ONLY
def test_a_non_ascii_credential_is_refused_without_echoing_it(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  paid:\n    kind: http\n    base_url: http://127.0.0.1:9/v1\n"
        "    credential_env: PAID_TOKEN\n    cost_per_image_minor: 4\n"
    )
    env = {"EPISODIC_PROVIDERS_FILE": str(profiles), "PAID_TOKEN": "s3cr\u00e9t-value"}
    assert cli("allocate", "--key", "k", "--week", "2026-W32", env=env).returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a"], profile="paid")
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist), env=env).returncode == 0
    refused = cli("generate", "2026-W32-0", env=env)
    _one_line_refusal(refused, "$PAID_TOKEN", "printable ASCII")
    assert "s3cr" not in refused.stderr + refused.stdout
    assert json.loads(cli("runs", "list", "--json", env=env).stdout) == []


def test_broken_homes_and_database_paths_are_one_line_errors(cli: Cli, tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k != "EPISODIC_DATABASE_URL"}
    for env, needle in (
        ({"EPISODIC_HOME": "/dev/null"}, "EPISODIC_HOME"),
        ({"EPISODIC_HOME": "/dev/null/x"}, "EPISODIC_HOME"),
        ({"EPISODIC_DATABASE_URL": "sqlite:////dev/null/x/e.db"}, "cannot be created"),
    ):
        result = subprocess.run(
            [str(Path(sys.executable).parent / "episodic"), "episodes", "list"],
            capture_output=True,
            text=True,
            env={**base, **env},
            timeout=60,
        )
        _one_line_refusal(result, needle)
    deep = tmp_path / "not" / "yet" / "there.db"  # a folder that does not exist: created
    made = cli("episodes", "list", env={"EPISODIC_DATABASE_URL": f"sqlite:///{deep}"})
    assert made.returncode == 0 and deep.is_file()


def test_without_limits_a_default_cap_refuses_a_costly_plan(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """A playlist that expands to far more than anyone meant: refused by default, with the
    plan shown; an explicit limit lets it run."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])  # 3 images, 0.12 USD
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    capped = {"EPISODIC_MAX_RUN_COST": "0.10"}
    for extra in ([], ["--plan"]):
        refused = cli("generate", "2026-W32-0", *extra, env=capped)
        _one_line_refusal(refused, "3 new paid calls", "0.12 USD", "EPISODIC_MAX_RUN_COST")
    assert json.loads(cli("runs", "list", "--json").stdout) == []
    assert [e for e in provider_log() if e["event"] == "job_created"] == []
    allowed = cli("generate", "2026-W32-0", "--max-cost", "0.20", env=capped)
    assert allowed.returncode == 0, allowed.stderr


def _python_c(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (``python -c``); its exit code and output."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def _until_handlers_are_in(pid: int) -> None:
    """Wait until process `pid` catches SIGTERM (Linux `/proc/<pid>/status`, ``SigCgt``): the
    console script installs its SIGINT handler and then its SIGTERM handler as its module's
    first statements, and Python itself never catches SIGTERM. Before that moment only CPython
    runs (its start, finding the module: about 10 ms here), and its own default handler
    answers a Ctrl-C with a traceback that no code of ours can prevent."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.0005)
    raise AssertionError("the console script never installed its SIGTERM handler")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_command_starts_is_one_line_never_a_traceback(
    signum: int, tmp_path: Path
) -> None:
    """Ctrl-C in the first half second (while the CLI imports its modules, even 0.05 s after
    the start, before `episodic.cli.entry` could import `typing`) is never a Python
    traceback: any moment from the console script's first statements gives at most one line
    and exit 130 (or the command's answer if it finished first)."""
    episodic = str(Path(sys.executable).parent / "episodic")
    for delay in (0.0, 0.01, 0.05, 0.15, 0.3, 0.5, 0.8, 1.2):
        _interrupted_once([episodic, "episodes", "list"], tmp_path, signum, delay)


def _interrupted_once(command: list[str], tmp_path: Path, signum: int, delay: float) -> None:
    """Start `command`, wait until its handlers are in, then `delay` seconds, send `signum`:
    it answers with at most one line, no traceback, exit 130 (or 0: it finished first)."""
    process = subprocess.Popen(
        command,
        env={**os.environ, "EPISODIC_HOME": str(tmp_path / "home")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _until_handlers_are_in(process.pid)
    time.sleep(delay)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert "Traceback" not in err, (delay, err)
    assert len(err.strip().splitlines()) <= 1, (delay, err)
    assert process.returncode in (0, 130), (signum, delay, process.returncode, err)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_between_the_console_scripts_import_and_main_is_one_line(
    signum: int,
) -> None:
    """The signal arrives, at an exact moment, after the console script has imported
    `cli.entry` and before it calls `main` (handlers put in only inside `main` would leave a
    KeyboardInterrupt traceback there). The command must not run."""
    code = (
        "import os, signal\n"
        "import episodic.cli.entry\n"
        f"os.kill(os.getpid(), {int(signum)})\n"
        "for _ in range(100000): pass  # the handler runs here\n"
        "episodic.cli.entry.main()\n"
    )
    done = _python_c(code)
    assert done.stderr == "error: interrupted\n", done.stderr
    assert done.returncode == 130 and done.stdout == ""


@pytest.mark.parametrize("answered", [False, True])
def test_an_interrupt_between_the_console_script_and_the_commands_handling_is_one_line(
    answered: bool,
) -> None:
    """An interrupt in the moment after the console script handed over and before
    `episodic.cli.app.main` took it (or a second signal that cut the command's own handling short)
    must not escape both as a traceback (a hook sends the signal at that line). The console
    script answers it: one line and exit 130, or no
    line when the command's own handling had already begun to answer."""
    code = (
        "import episodic.cli.entry, episodic.cli.app, episodic.cli.signals\n"
        "def main(argv=None):\n"
        f"    if {answered}:\n"
        "        episodic.cli.signals.interrupts.tell_listeners()\n"
        "    raise KeyboardInterrupt\n"
        "episodic.cli.app.main = main\n"
        "episodic.cli.entry.main()\n"
    )
    done = _python_c(code)
    assert done.returncode == 130, done.stderr
    assert done.stderr == ("" if answered else "error: interrupted\n")


def test_a_second_signal_while_the_console_script_answers_the_first_is_ignored() -> None:
    """A second signal while the console script writes its line must not print a traceback
    through its handler: both signals are ignored from the answer's first statement; the
    one line is written once."""
    code = (
        "import os, signal, sys\n"
        "import episodic.cli.entry\n"
        "real = sys.stderr.write\n"
        "def write(text):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    for _ in range(100000): pass  # a handler would run here\n"
        "    return real(text)\n"
        "sys.stderr.write = write\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "episodic.cli.entry.main()\n"
    )
    done = _python_c(code)
    assert done.stderr == "error: interrupted\n", done.stderr
    assert done.returncode == 130


@pytest.mark.parametrize("module", ["episodic.cli.entry", "episodic.cli.app"])
def test_python_m_cli_entry_ends_an_interrupted_command_with_its_exit_code(
    module: str, tmp_path: Path
) -> None:
    """Under ``python -m episodic.cli.entry`` an interrupted command exits 130, never dying by
    SIGINT (-2) after ``error: interrupted``: CPython's ``-m`` path ends the process by SIGINT
    when a KeyboardInterrupt once crossed one of its C-level evaluations, even a handled
    one. Tried at twelve moments for each signal: the death is rare at any one."""
    command = [sys.executable, "-m", module, "episodes", "list"]  # cli.app: the same path
    for signum in (signal.SIGTERM, signal.SIGINT):
        for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2):
            _interrupted_once(command, tmp_path, signum, delay)


def test_a_sigint_the_parent_ignores_stays_ignored(tmp_path: Path) -> None:
    """A command started with SIGINT ignored (``nohup``, a shell's background job) is not
    interrupted by Ctrl-C: the console script leaves an ignored SIGINT ignored, as Python
    itself does, rather than putting its own handler in."""
    episodic = str(Path(sys.executable).parent / "episodic")
    env = {**os.environ, "EPISODIC_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(
        [episodic, "episodes", "list", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    _until_handlers_are_in(process.pid)
    for _ in range(3):
        process.send_signal(signal.SIGINT)
        time.sleep(0.1)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out) == []


def test_importing_the_console_script_imports_nothing_before_its_handlers() -> None:
    """Every module `episodic.cli.entry` needs before its handlers are in was already loaded by the
    interpreter's start, so no import machinery (where an interrupt would surface as a
    traceback) runs before them but that of its own packages, `episodic` and `episodic.cli`,
    whose `__init__` modules import nothing."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import episodic.cli.entry\n"
        "packages = {'episodic', 'episodic.cli', 'episodic.cli.entry'}\n"
        "print(sorted(set(sys.modules) - before - packages))\n"
    )
    done = _python_c(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_interrupt_inside_a_callback_during_start_up_is_one_line_never_a_traceback() -> None:
    """A SIGTERM landing inside a weakref callback while the CLI imports its modules must not
    be printed as "Exception ignored ... KeyboardInterrupt" with a traceback while the command
    goes on. The signal here is sent from such a callback in the middle of importing
    `episodic.cli.app`."""
    code = (
        "import importlib.abc, importlib.util, os, signal, sys, time, weakref\n"
        "class Loader(importlib.abc.Loader):\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        "        class Thing: pass\n"
        "        thing = Thing()\n"
        "        def callback(_):\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            for _ in range(100000): pass  # the handler runs inside this callback\n"
        "        module.ref = weakref.ref(thing, callback)\n"
        "        del thing\n"
        "        time.sleep(0.5)\n"
        "        module.main = lambda: print('the command ran')\n"
        "class Finder(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'episodic.cli.app':\n"
        "            return importlib.util.spec_from_loader(name, Loader())\n"
        "sys.meta_path.insert(0, Finder())\n"
        "import episodic.cli.entry\n"
        "episodic.cli.entry.main()\n"
    )
    done = _python_c(code)
    assert done.stderr == "error: interrupted\n", done.stderr
    assert done.returncode == 130 and done.stdout == ""


def test_an_interrupt_outside_the_commands_own_handling_is_the_same_one_line() -> None:
    """A SIGTERM landing while `run` imports its exit codes (before its own handler) is no
    Python traceback: the console script's `main` answers any interrupt outside `run` the
    same way."""
    code = (
        "import episodic.cli.app as app\n"
        "def interrupted(argv):\n"
        "    raise KeyboardInterrupt\n"
        "app.run = interrupted\n"
        "app.main([])\n"
    )
    done = _python_c(code)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error: interrupted\n"


def test_an_interrupt_a_library_wrapped_in_its_own_error_is_still_an_interrupt() -> None:
    """A SIGTERM that landed while pydantic built a settings schema at start-up came out as
    `SchemaError: ... KeyboardInterrupt` and the command said "unexpected SchemaError",
    exit 1 (the fault suite, 1 in 55 trials). Once a SIGINT or SIGTERM has arrived, an
    unexpected error on the way out is the interrupt: one line, exit 130. Real signals."""
    code = (
        "import os, signal, episodic.cli.app as app\n"
        "from episodic.cli.app import app as typer_app\n"
        "@typer_app.command('boom')\n"
        "def boom() -> None:\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIG{sig})\n"
        "    except KeyboardInterrupt as exc:\n"
        "        raise RuntimeError('schema build failed: KeyboardInterrupt') from exc\n"
        "app.main(['boom'])\n"
    )
    for sig in ("TERM", "INT"):
        done = subprocess.run(
            [sys.executable, "-c", code.format(sig=sig)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 130, (sig, done.stderr)
        assert done.stderr == "error: interrupted (stopped in RuntimeError)\n", (sig, done.stderr)
    unsignalled = code.replace("os.kill(os.getpid(), signal.SIG{sig})", "raise KeyboardInterrupt")
    done = subprocess.run([sys.executable, "-c", unsignalled], capture_output=True, text=True)
    assert done.returncode == 1 and "unexpected RuntimeError" in done.stderr, done.stderr


def test_a_signal_after_the_command_finished_ends_it_with_its_answer_and_no_traceback() -> None:
    """A SIGTERM that landed after `generate` finished, while the interpreter joined its
    threads, printed "Exception ignored in: threading ... KeyboardInterrupt" with a
    traceback (the fault suite, 1 in 55 trials). The command's answer stands: the process
    ends with it at once, silently. Real signals, with a thread the shutdown waits for."""
    code = (
        "import threading, time, episodic.cli.app as app\n"
        "from episodic.cli.app import app as typer_app\n"
        "@typer_app.command('linger')\n"
        "def linger() -> None:\n"
        "    threading.Thread(target=time.sleep, args=(30,)).start()\n"
        "    print('done', flush=True)\n"
        "app.main(['linger'])\n"
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "done\n"
        time.sleep(0.5)  # past `main`: the interpreter waits for the thread
        process.send_signal(sig)
        _out, err = process.communicate(timeout=20)
        assert process.returncode == 0, (sig, err)
        assert err == "", (sig, err)


def test_an_interrupt_typer_answers_inside_a_command_is_said_in_one_line() -> None:
    """Typer answers a KeyboardInterrupt raised inside a command with exit 130 and nothing
    said, so a command would end silently. It is the same one line as every interrupt, and a
    command that reports its own interrupted outcome (generate) gets no second one."""
    code = (
        "import os, signal, episodic.cli.app as app\n"
        "from episodic.cli.app import app as typer_app\n"
        "@typer_app.command('ctrl-c')\n"
        "def ctrl_c() -> None:\n"
        "    os.kill(os.getpid(), signal.SIG{sig})\n"
        "app.main(['ctrl-c'])\n"
    )
    for sig in ("INT", "TERM"):
        done = subprocess.run(
            [sys.executable, "-c", code.format(sig=sig)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 130 and done.stderr == "error: interrupted\n", done.stderr


def test_a_signal_while_exit_hooks_run_lets_them_finish_and_keeps_the_answer() -> None:
    """After the command's answer, a signal while the interpreter runs its exit hooks must
    not end the process at once (nor, once finalization has reset the handlers, kill it:
    -15). From the exit hooks on, signals are ignored: the
    hooks finish (a database pool is closed) and the command's exit code stands."""
    code = (
        "import atexit, time, episodic.cli.app as app\n"
        "from episodic.cli.app import app as typer_app\n"
        "def hook() -> None:\n"
        "    print('hook', flush=True); time.sleep(1.0); print('hook done', flush=True)\n"
        "@typer_app.command('done')\n"
        "def done() -> None:\n"
        "    atexit.register(hook)\n"
        "app.main(['done'])\n"
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "hook\n"
        process.send_signal(sig)
        out, err = process.communicate(timeout=20)
        assert process.returncode == 0 and out == "hook done\n" and err == "", (sig, out, err)
