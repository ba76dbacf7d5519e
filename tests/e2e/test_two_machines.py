"""Paid media outlive the machine, end to end as users run it.

A real `prefect server` (on PostgreSQL), the episodes in PostgreSQL, a moto S3 server as the
media store, and two process workers, each in its own copy of the project folder with its
own state folder: two machines (`tests/e2e/two_machines.py`). The weekly chain runs with
generate on A's worker; A's worker stops and A's folder is deleted right after, at the
approval form; the form (read from the API) shows one preview per image, each the thumbnail
of an object in the store; approved, the run resumes on B's worker and assembles there; B's
`episodic check --all` is clean; the images, the cover and the manifest are in the bucket;
the provider's own log shows one job per image. The Chromium look at the same form is
`make ui-check` (tests/ui/two_machines_check.py, on this library).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.databases import PostgresDatabases, require_postgres
from tests.e2e.two_machines import PLANNED_ITEMS, PREFIX, story, two_machines

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def databases() -> Iterator[PostgresDatabases]:
    require_postgres()
    databases = PostgresDatabases()
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def database(databases: PostgresDatabases) -> Iterator[str]:
    name = databases.fresh(migrated=False)  # machine A's `episodic db upgrade` migrates it
    try:
        yield databases.url(name)
    finally:
        databases.drop(name)


@pytest.fixture
def prefect_database(databases: PostgresDatabases) -> Iterator[str]:
    from sqlalchemy.engine import make_url

    name = databases.fresh(migrated=False)
    try:
        url = make_url(databases.url(name)).set(drivername="postgresql+asyncpg")
        yield url.render_as_string(hide_password=False)
    finally:
        databases.drop(name)


def test_generate_on_one_machine_approve_and_assemble_on_another(
    tmp_path: Path, database: str, prefect_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPISODIC_HOME")  # each machine's state folder is its copy's own
    with two_machines(tmp_path, database, prefect_database) as stack:
        outcome = story(stack, "2026-W46")

    assert not stack.a.folder.exists()  # deleted at the form, before the approval
    assert len(outcome.form.previews) == PLANNED_ITEMS  # each the thumbnail of a stored image
    assert {"decision", "reviewer"} <= set(outcome.form.schema["required"])
    assert outcome.run["state_name"] == "Completed"
    assert [w.name for w in stack.workers] == ["machine-a", "machine-b"]
    checked = dict(outcome.check)
    assert checked.pop("spend")["verified"] is True  # check's spend totals
    assert checked == {"clean": True, "findings": [], "warnings": []}
    assert len(outcome.media) == PLANNED_ITEMS + 2  # the images, the cover, the manifest
    assert {m["stored"] for m in outcome.media.values()} == {"yes"}
    assert {f"{PREFIX}/{m['key']}" for m in outcome.media.values()} <= set(outcome.objects)
    assert any(k.startswith(f"{PREFIX}/prefect-results/") for k in outcome.objects)
    # the bill, from the provider's own log: one job per image, A's and B's runs together
    jobs = outcome.jobs
    assert len(jobs) == PLANNED_ITEMS and set(jobs.values()) == {1}, jobs.most_common(3)
