"""Checks in a real browser against the real Prefect UI (``make ui-check``, not ``make test``)."""
