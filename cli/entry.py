"""The `episodic` console script: a Ctrl-C (or SIGTERM) while the CLI is still importing its
modules (about half a second) is the same one line and exit code as one later, never a
Python traceback. Imports nothing heavy itself."""

from __future__ import annotations

import signal
import sys

INTERRUPTED = 130  # core.exit_codes.ExitCode.INTERRUPTED, without importing it yet


def main() -> None:
    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        from cli.app import main as app_main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(INTERRUPTED)
    app_main()


if __name__ == "__main__":  # python -m cli.entry
    main()
