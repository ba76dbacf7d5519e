"""Calls to the Prefect API from a command, bounded in total: a server that accepts
connections but never answers (hung, overloaded, a proxy that lost its upstream) must not
keep a command waiting for Prefect's 60 s request timeout, retried (about 7 minutes)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from prefect.settings import (
    PREFECT_API_REQUEST_TIMEOUT,
    PREFECT_CLIENT_MAX_RETRIES,
    get_current_settings,
    temporary_settings,
)

from episodic.core.urls import without_userinfo

T = TypeVar("T")

REQUEST_TIMEOUT_S = 5.0  # one request (connect, read, write, pool)
TOTAL_DEADLINE_S = 15.0  # everything the call does, retries included


class PrefectApiSilent(TimeoutError):
    """The Prefect API did not finish answering within the deadline."""


def api_label() -> str:
    """The configured Prefect API URL as a message may show it (no password)."""
    return without_userinfo(str(get_current_settings().api.url or ""))


def bounded(call: Callable[[], T], deadline_s: float = TOTAL_DEADLINE_S) -> T:
    """`call()` with short Prefect client timeouts and one retry, given `deadline_s` in all;
    raises PrefectApiSilent when it is not done by then (it is left to end in a daemon thread:
    the command goes on, and its process does not wait for it on exit)."""
    context = contextvars.copy_context()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            with temporary_settings(
                updates={
                    PREFECT_API_REQUEST_TIMEOUT: REQUEST_TIMEOUT_S,
                    PREFECT_CLIENT_MAX_RETRIES: 1,
                }
            ):
                outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=context.run, args=(run,), daemon=True, name="prefect-api")
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise PrefectApiSilent(f"no answer within {deadline_s:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
