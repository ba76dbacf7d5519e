"""The `episodic` command: a thin Typer app over `pipeline`.

Commands import their dependencies lazily; `episodic --help` and the read-only commands never
import Prefect. Errors are mapped to exit codes in one place, `main()`: a domain error prints
one line on stderr and exits with its code (DESIGN 10); set EPISODIC_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import suppress

import click
import typer

from cli import allocate as allocate_cmd
from cli import (
    check,
    db,
    demo,
    episodes,
    generate,
    legacy,
    maintenance,
    pipelines,
    prefect_setup,
    providers,
    replay,
    review,
    runs,
    serve,
)
from cli.output import error

app = typer.Typer(
    name="episodic",
    help="Durable episodes for recurring, paid work: never pay twice.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("allocate")(allocate_cmd.allocate)
app.command("plan")(generate.plan)
app.command("generate")(generate.generate)
app.command("retry")(generate.retry)
app.command("approve")(review.approve)
app.command("assemble")(review.assemble)
app.command("reopen")(review.reopen)
app.command("check")(check.check)
app.command("migrate-legacy")(legacy.migrate_legacy)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("sweep")(maintenance.sweep)
app.command("dispatch")(maintenance.dispatch)
app.command("replay")(replay.replay)
app.add_typer(episodes.app, name="episodes")
app.add_typer(runs.app, name="runs")
app.add_typer(db.app, name="db")
app.add_typer(pipelines.app, name="pipelines")
app.add_typer(providers.app, name="providers")
app.add_typer(prefect_setup.app, name="prefect")


def main(argv: list[str] | None = None) -> None:
    _terminate_like_interrupt()
    code: int | None = None
    try:
        code = run(argv)
        _finished(code)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside run's own handling (its first
        if code is None:  # import): the same line
            sys.stderr.write("error: interrupted\n")
            code = 130  # ExitCode.INTERRUPTED, which may be what was being imported
        _finished(code)
    sys.exit(code)


def interrupt_answered() -> bool:
    """Whether an interrupt reached the command's own handling (which says how the command
    ended, or was cut short by a second signal): the console script then adds no line."""
    return _signalled.is_set()


def _finished(code: int) -> None:
    """The command is over and `code` is its answer: a signal from here on (while the
    interpreter joins threads and runs exit handlers) ends the process with that answer at
    once, instead of a KeyboardInterrupt traceback from `threading._shutdown`."""

    def now(signum: int, frame: object) -> None:
        with suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    def quiet_from_here() -> None:  # the interpreter's finalization resets Python-level
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # handlers to the default (death by
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the signal); ignored ones stay

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, now)
        signal.signal(signal.SIGINT, now)
        atexit.register(quiet_from_here)  # after the threads are joined, first of the hooks


# Set by the first SIGINT or SIGTERM: whatever the interrupt turned into on its way out (a
# library that wraps the KeyboardInterrupt raised inside it, as pydantic's schema builder
# does at start-up), the command ends as interrupted, exit 130.
_signalled = threading.Event()
# Called by the first SIGINT or SIGTERM before the KeyboardInterrupt is raised: a raise can
# be swallowed (inside a weakref callback or a `__del__`, Python prints "Exception ignored"
# and goes on), so what must stop (a generation run's engine) is also told directly.
_on_signal: list[Callable[[], None]] = []


_reported = threading.Event()  # the command said how it ended (a run's outcome) itself


def mark_reported() -> None:
    """The command has printed its own answer (a generation run's outcome, interrupted
    included): an interrupt needs no further line."""
    _reported.set()


def on_signal(callback: Callable[[], None]) -> None:
    """Call `callback` (from the signal handler: it must only set flags) on an interrupt."""
    _on_signal.append(callback)


def _tell_listeners() -> None:
    _signalled.set()
    for callback in list(_on_signal):
        with suppress(Exception):
            callback()


def _terminate_like_interrupt() -> None:
    """SIGTERM (systemd, `docker stop`, a CI timeout) stops the command as Ctrl-C does: a
    generation run releases its claims and pauses (exit 130), resumable at once. Further
    SIGTERMs while it winds down are ignored, so the pause is recorded."""

    def on_terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _tell_listeners()
        raise KeyboardInterrupt

    def on_interrupt(signum: int, frame: object) -> None:
        _tell_listeners()
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_terminate)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, on_interrupt)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises, never prints a traceback)."""
    from core.exit_codes import ExitCode

    args = sys.argv[1:] if argv is None else argv
    _on_signal.clear()  # listeners belong to one command (tests run many in one process)
    _reported.clear()
    for arg in args:  # a process can never receive one (execve); a caller in Python can
        if "\x00" in arg:
            error("an argument contains a NUL byte; nothing was done")
            return ExitCode.REFUSED
    try:
        command = typer.main.get_command(app)
        result = command.main(args=args, prog_name="episodic", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:  # usage errors: exit 2, one line like every error
        context_ = getattr(exc, "ctx", None)
        hint = f" (see: {context_.command_path} --help)" if context_ is not None else ""
        error(f"{exc.format_message()}{hint}")
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        error("interrupted")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        if _signalled.is_set() and not _is_answer(exc):  # the interrupt, wrapped on its way
            error(f"interrupted (stopped in {type(exc).__name__})")
            return ExitCode.INTERRUPTED
        return _report(exc)
    if result == ExitCode.INTERRUPTED and _signalled.is_set() and not _reported.is_set():
        error("interrupted")  # Typer answers an interrupt inside a command with a bare 130
    return result if isinstance(result, int) else ExitCode.OK


def _is_answer(exc: Exception) -> bool:
    from core.errors import EpisodicError

    return isinstance(exc, EpisodicError)


def _report(exc: Exception) -> int:
    from core.errors import EpisodicError
    from core.exit_codes import ExitCode

    if os.environ.get("EPISODIC_DEBUG"):
        import traceback

        traceback.print_exception(exc)
    if isinstance(exc, EpisodicError):
        error(str(exc))
        return exc.exit_code
    database_error = _database_error(exc)
    if database_error is not None:
        error(database_error)
        return ExitCode.ERROR
    error(f"unexpected {type(exc).__name__}: {exc} (set EPISODIC_DEBUG=1 for a traceback)")
    return ExitCode.ERROR


def _database_error(exc: Exception) -> str | None:
    """One line for a driver error, without SQL parameters or connection secrets."""
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return None
    first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
    return f"database error: {first_line}"


if __name__ == "__main__":  # python -m cli.app: the console script's path, interrupts included
    import runpy

    runpy.run_module("cli.entry", run_name="__main__", alter_sys=True)
