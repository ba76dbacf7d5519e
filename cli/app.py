"""The `episodic` command: a thin Typer app over `pipeline`.

Commands import their dependencies lazily; `episodic --help` and the read-only commands never
import Prefect. Errors are mapped to exit codes in one place, `main()`: a domain error prints
one line on stderr and exits with its code; set EPISODIC_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import sys
from typing import Annotated

import click
import typer

from episodic.cli import allocate as allocate_cmd
from episodic.cli import (
    check,
    db,
    demo,
    episodes,
    generate,
    init,
    legacy,
    maintenance,
    media,
    pipelines,
    prefect_setup,
    providers,
    replay,
    review,
    runs,
    serve,
    spend,
    state,
)
from episodic.cli.output import error, one_line, warning
from episodic.cli.signals import interrupts

app = typer.Typer(
    name="episodic",
    help="Durable episodes for recurring, paid work: never pay twice.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("episodic")
        except PackageNotFoundError:  # running from a checkout that was never installed
            number = "unknown (not installed: run `make bootstrap`)"
        typer.echo(f"episodic {number}")
        raise typer.Exit(0)


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_show_version,
            is_eager=True,
            help="Print the installed version (episodic X.Y.Z) and exit.",
        ),
    ] = False,
) -> None:
    """Durable episodes for recurring, paid work: never pay twice."""


app.command("allocate")(allocate_cmd.allocate)
app.command("plan")(generate.plan)
app.command("generate")(generate.generate)
app.command("retry")(generate.retry)
app.command("preview")(review.preview)
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
app.command("spend")(spend.spend)
app.command("init")(init.init)
app.command("schema")(init.schema)
app.add_typer(episodes.app, name="episodes")
app.add_typer(runs.app, name="runs")
app.add_typer(db.app, name="db")
app.add_typer(pipelines.app, name="pipelines")
app.add_typer(providers.app, name="providers")
app.add_typer(prefect_setup.app, name="prefect")
app.add_typer(state.app, name="state")
app.add_typer(media.app, name="media")


def main(argv: list[str] | None = None) -> None:
    interrupts.install()
    code: int | None = None
    try:
        code = run(argv)
        interrupts.finish(code)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside run's own handling (its first
        if code is None:  # import): the same line
            sys.stderr.write("error: interrupted\n")
            code = 130  # ExitCode.INTERRUPTED, which may be what was being imported
        interrupts.finish(code)
    sys.exit(code)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises, never prints a traceback)."""
    from episodic.core.exit_codes import ExitCode

    args = sys.argv[1:] if argv is None else argv
    interrupts.begin_command()
    for arg in args:  # a process can never receive one (execve); a caller in Python can
        if "\x00" in arg:
            error("an argument contains a NUL byte; nothing was done")
            return ExitCode.REFUSED
    try:
        command = typer.main.get_command(app)
        result = command.main(args=args, prog_name="episodic", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        # Typer's answer to a closed output pipe: stdout and stderr made quiet, then exit 1,
        # which this command line keeps for a crash
        if isinstance(exc.__context__, BrokenPipeError):
            return ExitCode.READER_GONE
        raise
    except click.ClickException as exc:  # usage errors: exit 2, one line like every error
        context_ = getattr(exc, "ctx", None)
        hint = f" (see: {context_.command_path} --help)" if context_ is not None else ""
        # a group named without its command answers with its help and no message of its own
        said = exc.format_message() or "give a command"
        error(f"{said}{hint}")
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        error("interrupted")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        # the interrupt, wrapped on its way out
        if interrupts.signalled.is_set() and not _is_answer(exc):
            error(f"interrupted (stopped in {type(exc).__name__})")
            return ExitCode.INTERRUPTED
        return _report(exc)
    if (
        result == ExitCode.INTERRUPTED
        and interrupts.signalled.is_set()
        and not interrupts.reported.is_set()
    ):
        error("interrupted")  # Typer answers an interrupt inside a command with a bare 130
    return result if isinstance(result, int) else ExitCode.OK


def _is_answer(exc: Exception) -> bool:
    from episodic.core.errors import EpisodicError

    return isinstance(exc, EpisodicError)


def _report(exc: Exception) -> int:
    from episodic.core.errors import EpisodicError, PlaylistMistakes
    from episodic.core.exit_codes import ExitCode
    from episodic.core.flags import env_flag

    debug = env_flag("EPISODIC_DEBUG")
    if debug.warning is not None:
        warning(debug.warning)
    if debug.on:
        import traceback

        traceback.print_exception(exc)
    if isinstance(exc, PlaylistMistakes) and len(exc.mistakes) > 1:  # one message, some lines
        error(exc.header)
        for mistake in exc.mistakes:
            sys.stderr.write(f"  {one_line(mistake)}\n")
        return exc.exit_code
    if isinstance(exc, EpisodicError):
        error(str(exc))
        return exc.exit_code
    database_error = _database_error(exc)
    if database_error is not None:
        error(database_error)
        return ExitCode.ERROR
    prefect_error = _prefect_api_error(exc)
    if prefect_error is not None:
        error(prefect_error)
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


def _prefect_api_error(exc: Exception) -> str | None:
    """One line for a Prefect API that could not be reached (refused, unresolvable, or
    silent past the client's timeouts), naming its URL without a password."""
    if "prefect" not in sys.modules or "httpx" not in sys.modules:
        return None
    import httpx

    if not isinstance(exc, (httpx.ConnectError, httpx.TimeoutException)):
        return None
    from prefect.settings import get_current_settings

    from episodic.core.urls import without_userinfo

    url = get_current_settings().api.url
    where = f" at {without_userinfo(str(url))}" if url else ""
    return f"the Prefect API{where} did not answer ({type(exc).__name__})"


if __name__ == "__main__":  # python -m episodic.cli.app: the console script's path, interrupts too
    import runpy

    runpy.run_module("episodic.cli.entry", run_name="__main__", alter_sys=True)
