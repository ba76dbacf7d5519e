"""Interrupts of one command: SIGINT and SIGTERM, what they stop, and who says so.

SIGTERM (systemd, `docker stop`, a CI timeout) stops a command as Ctrl-C does: a generation
run releases its claims and pauses (exit 130), resumable at once. The first signal sets
`Interrupts.signalled` and tells the listeners before the KeyboardInterrupt is raised,
because a raise can be swallowed (inside a weakref callback or a `__del__`, Python prints
"Exception ignored" and goes on) and what must stop (a generation run's runner) is then
still told directly. Whatever the interrupt turned into on its way out (a library that wraps
the KeyboardInterrupt raised inside it, as pydantic's schema builder does at start-up), the
command ends as interrupted, exit 130.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import suppress


class Interrupts:
    """The process's interrupt state: one object, reset per command (`begin_command`)."""

    def __init__(self) -> None:
        self.signalled = threading.Event()  # set by the first SIGINT or SIGTERM
        self.reported = threading.Event()  # the command said how it ended (a run's outcome)
        self._listeners: list[Callable[[], None]] = []

    def answered(self) -> bool:
        """Whether an interrupt reached the command's own handling (which says how the
        command ended, or was cut short by a second signal): the console script then adds
        no line."""
        return self.signalled.is_set()

    def mark_reported(self) -> None:
        """The command has printed its own answer (a generation run's outcome, interrupted
        included): an interrupt needs no further line."""
        self.reported.set()

    def on_signal(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the signal handler: it must only set flags) on an
        interrupt."""
        self._listeners.append(callback)

    def tell_listeners(self) -> None:
        """What the first signal does before its KeyboardInterrupt is raised."""
        self.signalled.set()
        for callback in list(self._listeners):
            with suppress(Exception):
                callback()

    def begin_command(self) -> None:
        """Listeners and the report belong to one command (tests run many in one process)."""
        self._listeners.clear()
        self.reported.clear()

    def install(self) -> None:
        """Make SIGTERM stop the command as Ctrl-C does. Further SIGTERMs while it winds
        down are ignored, so the pause is recorded."""

        def on_terminate(signum: int, frame: object) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.tell_listeners()
            raise KeyboardInterrupt

        def on_interrupt(signum: int, frame: object) -> None:
            self.tell_listeners()
            raise KeyboardInterrupt

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_terminate)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, on_interrupt)

    def finish(self, code: int) -> None:
        """The command is over and `code` is its answer: a signal from here on (while the
        interpreter joins threads and runs exit handlers) ends the process with that answer
        at once, instead of a KeyboardInterrupt traceback from `threading._shutdown`."""

        def now(signum: int, frame: object) -> None:
            with suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

        def quiet_from_here() -> None:  # the interpreter's finalization resets Python-level
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # handlers to the default (death
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # by the signal); ignored ones stay

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, now)
            signal.signal(signal.SIGINT, now)
            atexit.register(quiet_from_here)  # after the threads are joined, first of the hooks


interrupts = Interrupts()
