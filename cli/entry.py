"""The `episodic` console script: a Ctrl-C (or SIGTERM) at any moment after Python starts running
this module is the same one line and exit code as one later, never a Python traceback.

The handlers go in as this module's first statements, before it imports anything: `_signal` and
`sys` are built in and loaded by the interpreter's own start, so no import (and no Python-level
import machinery, where an interrupt would otherwise surface) runs before them. Until `main`
starts, a handler only records the signal; `main` then answers it. What remains is CPython's own
start and its finding of this module (about 10 ms here), before any line of episodic runs.

Importing this module replaces the process's SIGINT and SIGTERM handlers: only the console
script (and ``python -m episodic.cli.entry``) imports it."""

import _signal  # type: ignore[import-not-found]  # no stub; `signal` would import enum first
import sys

_signalled: list[int] = []
_armed = False


def _interrupt(signum: int, frame: object) -> None:
    _signalled.append(signum)
    if _armed and len(_signalled) == 1:  # the first one stops the command; later ones are
        raise KeyboardInterrupt  # recorded only, so the stop is never cut short


# SIGINT first: a SIGINT pending when a call returns is handled by the handler in place then,
# while a SIGTERM before its own handler is in simply ends the process (its default action).
# A SIGINT the parent set to be ignored (`nohup`, a shell's background job) stays ignored.
_SIGINT_OURS = _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN
if _SIGINT_OURS:
    _signal.signal(_signal.SIGINT, _interrupt)
_signal.signal(_signal.SIGTERM, _interrupt)

INTERRUPTED = 130  # core.exit_codes.ExitCode.INTERRUPTED, without importing it yet


def quiet_interrupts(unraisable: object) -> None:
    """`sys.unraisablehook` of the command's process: an interrupt raised where Python cannot
    propagate it (the signal landed inside a weakref callback or a ``__del__``, as during an
    import) is dropped without the "Exception ignored" traceback; the signal handlers record
    every interrupt, so the command still ends as interrupted. Anything else is reported as
    Python does."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)  # type: ignore[arg-type]


def main() -> None:
    """Run the command line (`cli.app.main`); exit 130 with ``error: interrupted`` on stderr if
    SIGINT or SIGTERM arrived outside the command's own handling (before it, or in the
    moment between this function's handling and `episodic.cli.app.main`'s), at most one line however
    many signals arrive."""
    global _armed
    sys.unraisablehook = quiet_interrupts
    try:
        _armed = True
        if _signalled:  # arrived between this module's first line and now
            raise KeyboardInterrupt
        from episodic.cli.app import main as app_main

        if _SIGINT_OURS:  # the command's own handling from here
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        if _signalled:  # raised inside a callback during the import, where it was dropped
            raise KeyboardInterrupt
        app_main()  # exits (SystemExit) with the command's answer, interrupted included
    except KeyboardInterrupt:
        # No call before the `try` below: Python runs a pending signal's handler only at a
        # call's end or a function's start, so a further signal lands inside it. Ignoring
        # both signals first (retried if a pending one interrupts the change), the line is
        # then written exactly once.
        while True:
            try:
                _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
                _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
                break
            except KeyboardInterrupt:
                continue
        if not _command_answered():
            sys.stderr.write("error: interrupted\n")
        sys.exit(INTERRUPTED)


def _command_answered() -> bool:
    """Whether an interrupt reached the command's own handling (`episodic.cli.signals`, which
    `episodic.cli.app` imports, may be missing, or half imported when the interrupt cut its import
    short)."""
    interrupts = getattr(sys.modules.get("episodic.cli.signals"), "interrupts", None)
    return interrupts is not None and bool(interrupts.answered())


def _as_module() -> None:
    """``python -m episodic.cli.entry``: as `main`, but an interrupted command's exit code is final.
    Under ``-m`` CPython ends a process by SIGINT (-2) instead of with its exit code when a
    KeyboardInterrupt once crossed one of its C-level evaluations, even one handled since
    (measured: 5 single signals in 60 ended -2 after ``error: interrupted``); the console
    script's path exits with the code."""
    try:
        main()
    except SystemExit as stop:
        if _signalled or _command_answered():
            import os
            from contextlib import suppress

            for stream in (sys.stdout, sys.stderr):
                with suppress(Exception):  # a closed pipe: nothing more to say
                    stream.flush()
            os._exit(stop.code if isinstance(stop.code, int) else INTERRUPTED)
        raise


if __name__ == "__main__":  # python -m episodic.cli.entry
    _as_module()
