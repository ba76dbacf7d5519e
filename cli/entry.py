"""The `episodic` console script: a Ctrl-C (or SIGTERM) while the CLI is still importing its
modules (about half a second) is the same one line and exit code as one later, never a
Python traceback. Imports nothing heavy itself."""

from __future__ import annotations

import signal
import sys
from typing import Any

INTERRUPTED = 130  # core.exit_codes.ExitCode.INTERRUPTED, without importing it yet


def quiet_interrupts(unraisable: Any) -> None:
    """`sys.unraisablehook` of the command's process: an interrupt raised where Python cannot
    propagate it (the signal landed inside a weakref callback or a ``__del__``, as during an
    import) is dropped without the "Exception ignored" traceback; the signal handlers record
    every interrupt, so the command still ends as interrupted. Anything else is reported as
    Python does."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


def main() -> None:
    signalled: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        signalled.append(signum)
        raise KeyboardInterrupt

    sys.unraisablehook = quiet_interrupts
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        from cli.app import main as app_main

        signal.signal(signal.SIGINT, signal.default_int_handler)  # the command's own from here
        if signalled:  # raised inside a callback during the import, where it was dropped
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(INTERRUPTED)
    app_main()


if __name__ == "__main__":  # python -m cli.entry
    main()
