"""Process exit codes. The single source of truth for their meaning."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # unexpected error (a crash, a database or store that cannot be read)
    REFUSED = 2  # refused before any work: bad input, budget guard
    ALLOCATION_CONFLICT = 3
    RUN_FAILED = 4  # every item failed
    NOT_FOUND = 5  # episode not found
    PARTIAL = 6  # some items failed
    BUDGET_REACHED = 7  # stopped buying at a cap or a period budget; in-flight work collected
    CHECK_FINDINGS = 8  # `check` read everything and found problems (each one listed)
    INTERRUPTED = 130
    # whoever read the output closed it first (`episodic check | head`): 128 + SIGPIPE, what a
    # shell reports for a command a closed pipe ended, nothing written on stderr
    READER_GONE = 141
