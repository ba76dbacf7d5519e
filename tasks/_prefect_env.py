"""Prefect settings this project relies on, applied before Prefect is first imported.

Only defaults are set (a user's explicit environment wins): a project-local ``PREFECT_HOME``
so the ephemeral server's database is migrated once and reused, a startup timeout long
enough for that first migration on two cores, result storage under ``EPISODIC_HOME``, and
no telemetry (this project never reaches out to the network). ``EPISODIC_HOME`` is resolved as
`core.settings` resolves it (`core.home`: the project's state folder wherever the command
starts), so Prefect's home is always inside the same state folder as the ledger.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def configure() -> None:
    if "prefect" in sys.modules:  # too late to change what Prefect read at import
        return
    from episodic.core.errors import InvalidInput
    from episodic.core.home import (  # no Prefect, no third-party import
        mark_state_folder,
        resolve_home,
    )

    try:
        home = resolve_home(os.environ.get("EPISODIC_HOME"))
    except InvalidInput:  # a bad EPISODIC_HOME / EPISODIC_PROJECT_DIR: the settings refuse it
        return  # in one line when the command loads them; nothing is created meanwhile
    if "PREFECT_HOME" not in os.environ:
        mark_state_folder(home)
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
        "DO_NOT_TRACK": "1",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    # Prefect's ephemeral server cannot open its database in a folder that does not exist.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
