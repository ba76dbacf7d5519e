"""The approval form in Chromium after the generating machine is gone (``make ui-check``).

    python -m tests.ui.two_machines_check

The story of ``tests/e2e/test_two_machines.py``, on the same library
(``tests.e2e.two_machines.story``): machine A (a copy of the project folder, its own state
folder, its own worker) generates the weekly episode into an S3 store (a moto server) and
stops at the approval form; A's folder is deleted. Then, and only then, headless Chromium
opens the waiting run's page on both Prefect UIs (v1 and v2), clicks Resume and checks that
the form shows one thumbnail per image, each decoded by the browser and laid out, each
exactly the thumbnail the library found to be made from an object in the S3 store. Then
the run is approved and assembles on machine B, B's `check --all` is clean and the
provider's log shows one job per image.

Everything but the browser step runs in ``make test`` (the pytest test); this module adds
the browser. The episodes' database is a fresh one on the local PostgreSQL server when it
answers (as the test), else a SQLite file both machines reach. Screenshots and reports:
``.episodic/ui-check/two-machines-*``. Prints one line; exits 1 on failure, keeping the work
folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.e2e.two_machines import PLANNED_ITEMS, Form, TwoMachines, TwoMachinesFailed, story
from tests.e2e.two_machines import two_machines as stack_of
from tests.ui.ui_check import (
    CHROMEDRIVER,
    CHROMIUM,
    DATA_JPEG,
    IMAGES_JS,
    OUT_DIR,
    UIS,
    CheckFailed,
    Ui,
    _sigterm,
    browser_logs,
    chromium,
    open_the_form,
    wait_for,
)


@contextlib.contextmanager
def shared_database(work: Path) -> Iterator[str]:
    """An empty database for the episodes: PostgreSQL's when it answers, else SQLite."""
    from tests.databases import PostgresDatabases, pg_available

    if pg_available() is not None:
        (work / "shared").mkdir(parents=True)
        yield f"sqlite:///{work / 'shared' / 'episodic.db'}"
        return
    databases = PostgresDatabases()
    name = databases.fresh(migrated=False)
    try:
        yield databases.url(name)
    finally:
        databases.drop(name)
        databases.close()


def look_in_chromium(work: Path, reports: list[dict[str, Any]]) -> Any:
    """The browser step for `story`: both UIs' forms, A's folder already gone."""

    def look(stack: TwoMachines, flow_run_id: str, form: Form) -> None:
        with chromium(work) as driver:
            for ui in UIS:
                reports.append(check_form_in(driver, stack, ui, flow_run_id, form))

    return look


def check_form_in(
    driver: Any, stack: TwoMachines, ui: Ui, flow_run_id: str, form: Form
) -> dict[str, Any]:
    shot = OUT_DIR / f"two-machines-form-{ui.name}.png"
    report: dict[str, Any] = {"ui": ui.name, "screenshot": str(shot)}
    try:
        driver.get(stack.server.ui_url + ui.path.format(id=flow_run_id))
        modal = open_the_form(driver, ui)

        def decoded() -> list[dict[str, Any]] | None:
            found = driver.execute_script(IMAGES_JS, modal, DATA_JPEG)
            loaded = [i for i in found if i["complete"] and i["natural_width"] > 0]
            return found if len(loaded) == PLANNED_ITEMS == len(found) else None

        thumbnails = wait_for(f"{ui.name}: {PLANNED_ITEMS} decoded thumbnails", decoded)
        hidden = [i["alt"] for i in thumbnails if i["shown_width"] < 8 or i["shown_height"] < 8]
        if hidden:
            raise CheckFailed(f"{ui.name}: thumbnails laid out with no size: {hidden}")
        srcs = driver.execute_script(
            "return Object.fromEntries([...arguments[0].querySelectorAll('img')]"
            ".filter(i => (i.getAttribute('src') || '').startsWith(arguments[1]))"
            ".map(i => [i.getAttribute('alt'), i.getAttribute('src')]))",
            modal,
            DATA_JPEG,
        )
        if srcs != form.previews:  # each checked against the store's objects by `form`
            raise CheckFailed(f"{ui.name}: the browser's images are not the store's thumbnails")
        report["thumbnails"] = thumbnails
        return report
    finally:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(shot))
        report["console_errors"], report["off_machine_requests"] = browser_logs(driver)
        (OUT_DIR / f"two-machines-report-{ui.name}.json").write_text(
            json.dumps(report, indent=2) + "\n"
        )


def main() -> int:
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _sigterm)
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        print(f"ui-check: FAILED: {CHROMIUM} or {CHROMEDRIVER} missing", file=sys.stderr)
        return 1
    for name in [n for n in os.environ if n.startswith("EPISODIC_")]:
        del os.environ[name]  # each machine's state folder is its copy's own
    work = Path(tempfile.mkdtemp(prefix="episodic-ui-two-machines-"))
    reports: list[dict[str, Any]] = []
    try:
        with shared_database(work) as database, stack_of(work, database) as stack:
            outcome = story(stack, look=look_in_chromium(work, reports))
        jobs = outcome.jobs
        if len(jobs) != PLANNED_ITEMS or set(jobs.values()) != {1}:
            raise TwoMachinesFailed(f"provider jobs per image: {jobs.most_common(3)}")
    except (CheckFailed, TwoMachinesFailed) as exc:
        print(f"ui-check: FAILED (two machines): {exc} (work folder kept: {work})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ui-check: interrupted (work folder kept: {work})", file=sys.stderr)
        return 130
    print(
        f"ui-check: OK (two machines): machine A generated {outcome.episode_id} into the S3 "
        f"store and its folder was deleted; "
        + "; ".join(
            f"{r['ui']}: {len(r['thumbnails'])}/{PLANNED_ITEMS} thumbnails from the store decoded"
            for r in reports
        )
        + f"; approved and assembled on machine B, check clean, one provider job per image; "
        f"{time.monotonic() - began:.1f}s",
        flush=True,
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
