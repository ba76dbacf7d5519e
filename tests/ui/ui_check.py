"""Does a person approving an episode in the real Prefect UI see the images? (``make ui-check``)

    python -m tests.ui.ui_check

1. starts a real ``prefect server`` with its UI (``tests.e2e.stack.PrefectServer``) in a
   temporary folder, with ``EPISODIC_HOME`` in that folder too;
2. in this process, pointed at that server: registers a deployment of the weekly flow for a
   3-video, 5-image playlist (fake provider), has the server schedule one slot and executes
   it as a worker would, until the run is suspended at its approval form; the third video is
   a hero run of 3 candidates, so the form also asks which candidate ships;
3. opens the flow run's page in headless Chromium (Debian's ``chromium`` and
   ``chromium-driver``, driven by selenium), clicks Resume and checks the form the reviewer
   gets: one inline thumbnail (``data:image/jpeg;base64,...``) per image of the episode, each
   decoded by the browser (``naturalWidth > 0``) and laid out (each hero candidate among
   them), and the decision, reviewer and hero pick fields required (not "(Optional)").
   Prefect 3.9 ships two UIs and its sidebar switches between them: the default one (v1,
   ``/runs/flow-run/ID``, Resume in the header) and the new one (v2,
   ``/v2/runs/flow-run/ID``, Resume in the "⋮" menu); both are checked;
4. saves screenshots of both forms, ``.episodic/ui-check/resume-form.png`` (v1) and
   ``resume-form-v2.png``, with ``report-v1.json``/``report-v2.json`` (thumbnails, console
   errors, requests the page tried to send off the machine) beside them, and prints one
   summary line.

On failure it prints one line with the reason, keeps the work folder (server log,
chromedriver log) and exits 1; the screenshot and the page's HTML of the failing UI are in
``.episodic/ui-check``. The server, the browser and chromedriver are always stopped.

Nothing leaves the machine: the browser runs with its background networking off and resolves
no host name but the local server's (the v2 UI tries to reach Amplitude's config server even
with Prefect's analytics off; the summary lists such attempts).

Not part of ``make test``: ``make ui-check`` installs what it needs and runs this.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.e2e.stack import PrefectServer

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / ".episodic" / "ui-check"
SCREENSHOT = OUT_DIR / "resume-form.png"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TITLES = ["first light", "second wind", "third act"]
HERO = {3: 3}  # the third video is a hero run of 3 candidates: the reviewer picks one
IMAGES = 2 + 3
PICK_FIELD = "v03: the candidate that ships"
MONDAY = datetime(2026, 8, 3, tzinfo=UTC)  # 2026-W32
DATA_JPEG = "data:image/jpeg;base64,"
WAIT_S = 90.0
#: The resume form: prefect-design's modal card (v1) or a dialog (v2) titled Resume Flow Run.
FORM_XPATH = (
    "//*[contains(@class,'p-modal__card') or @role='dialog']"
    "[.//*[normalize-space(.)='Resume Flow Run']]"
)

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--window-size=1400,2000",
    # no DNS: nothing the UI tries to fetch from the internet can leave the machine
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]

#: The thumbnails inside the open modal (the page behind it shows none).
IMAGES_JS = """
const modal = arguments[0];
return [...modal.querySelectorAll('img')]
  .filter(i => (i.getAttribute('src') || '').startsWith(arguments[1]))
  .map(i => {
    const r = i.getBoundingClientRect();
    return {alt: i.getAttribute('alt'), complete: i.complete, natural_width: i.naturalWidth,
            natural_height: i.naturalHeight, shown_width: r.width, shown_height: r.height};
  });
"""


class CheckFailed(Exception):
    """What the reviewer would not see (or could not do); one line."""


def say(message: str) -> None:
    print(f"ui-check: {message}", file=sys.stderr, flush=True)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # run the finally blocks: stop the browser and the server


# --------------------------------------------------------------------------------------------
# the waiting run
# --------------------------------------------------------------------------------------------


def point_this_process_at(server: PrefectServer, home: Path) -> None:
    """This process becomes a client of ``server`` with its own EPISODIC_HOME, before Prefect
    is imported (Prefect reads its settings at import)."""
    if "prefect" in sys.modules:
        raise CheckFailed("prefect was imported before PREFECT_API_URL was set")
    for name in list(os.environ):
        if name.startswith(("PREFECT_", "EPISODIC_")):
            del os.environ[name]
    os.environ.update(server.client_vars())  # PREFECT_API_URL, client PREFECT_HOME, marker
    os.environ["EPISODIC_HOME"] = str(home)
    os.environ["EPISODIC_TIMEZONE"] = "UTC"
    import tasks  # noqa: F401  (the project's Prefect defaults first)

    importlib.import_module("prefect.main")  # then Prefect, which configures its logging

    # Prefect's console output of the in-process run would drown the summary; the run's
    # logs still go to the server (the API handler is untouched).
    for logger in (logging.getLogger(), logging.getLogger("prefect")):
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.setLevel(logging.WARNING)


def suspend_a_run_at_its_approval_form(work: Path) -> tuple[str, int, list[str]]:
    """A weekly slot run of a 3-video playlist (5 images), suspended at its form. Returns the
    flow run id, the number of images of the episode and the previews' labels in the form."""
    from prefect.client.orchestration import get_client
    from prefect.schedules import Cron

    from flows import local
    from flows.weekly import weekly_episode
    from tests.generation import write_playlist

    playlist = write_playlist(work / "playlist", TITLES, hero=HERO)
    schedule = Cron("0 9 * * 1", timezone="UTC", slug="ui-check-slot")
    deployment = local.apply_deployment(
        weekly_episode, "ui-check", schedule, parameters={"playlist": str(playlist)}
    )
    (run,) = local.schedule_slots(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    if not state.is_paused():
        raise CheckFailed(f"the weekly run did not stop at its approval form: {state!r}")
    with get_client(sync_client=True) as client:
        paused = client.read_flow_run(run.id).state
        keyset = paused.state_details.run_input_keyset if paused else None
        if not keyset:
            raise CheckFailed("the suspended run has no input form (no run_input_keyset)")
        description = json.loads(client.read_flow_run_input(run.id, keyset["description"]))
    labels = [
        chunk.split("]", 1)[0]
        for chunk in description.split("![")[1:]
        if chunk.split("]", 1)[1].startswith("(" + DATA_JPEG)
    ]
    images = IMAGES
    if len(labels) != images:
        raise CheckFailed(
            f"the form's description inlines {len(labels)} previews for {images} images"
        )
    return str(run.id), images, labels


def flush_prefect() -> None:
    """Send what the in-process run still buffers (logs, events) while the server is up."""
    with contextlib.suppress(Exception):
        from prefect.logging.handlers import APILogHandler

        APILogHandler.flush()
    with contextlib.suppress(Exception):
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=5)


# --------------------------------------------------------------------------------------------
# the browser
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ui:
    """One of the two UIs a Prefect 3.9 server ships (the sidebar switches between them)."""

    name: str
    path: str  # the flow run's page, below the server's base URL
    screenshot: Path
    resume_in_menu: bool  # v1: a Resume button in the header; v2: Resume in the "⋮" menu


UIS = (
    Ui("v1", "/runs/flow-run/{id}", SCREENSHOT, resume_in_menu=False),
    Ui("v2", "/v2/runs/flow-run/{id}", OUT_DIR / "resume-form-v2.png", resume_in_menu=True),
)


@contextlib.contextmanager
def chromium(work: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in [*CHROMIUM_ARGS, f"--user-data-dir={work / 'chromium-profile'}"]:
        options.add_argument(arg)
    # console messages, and every request the page makes (to see what leaves the machine)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(work / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(WAIT_S)
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()


def wait_for(what: str, condition: Any, timeout: float = WAIT_S) -> Any:
    """Poll ``condition()`` until it returns something truthy; CheckFailed after timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:  # stale elements while the SPA re-renders
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(0.25)
    reason = f" (last error: {type(last_error).__name__})" if last_error else ""
    raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what}{reason}")


def displayed(driver: Any, xpath: str) -> Any:
    from selenium.webdriver.common.by import By

    for element in driver.find_elements(By.XPATH, xpath):
        if element.is_displayed() and element.is_enabled():
            return element
    return None


def open_the_form(driver: Any, ui: Ui) -> Any:
    """Click Resume on the flow run's page; returns the resume form once it shows its fields."""
    if ui.resume_in_menu:
        wait_for(
            f"{ui.name}: the flow run's menu button",
            lambda: displayed(driver, "//button[normalize-space(.)='Open menu']"),
        ).click()
        wait_for(
            f"{ui.name}: Resume in the flow run's menu",
            lambda: displayed(driver, "//*[@role='menuitem'][normalize-space(.)='Resume']"),
        ).click()
    else:
        wait_for(
            f"{ui.name}: the Resume button on the flow run's page",
            lambda: displayed(driver, "//button[normalize-space(.)='Resume']"),
        ).click()

    def form() -> Any:
        from selenium.webdriver.common.by import By

        for element in driver.find_elements(By.XPATH, FORM_XPATH):
            if element.is_displayed() and "Reviewer" in element.text:
                return element
        return None

    return wait_for(f"{ui.name}: the resume form ('Resume Flow Run' and its fields)", form)


def check_the_form(driver: Any, ui: Ui, form: Any, images: int, labels: list[str]) -> list[Any]:
    """The thumbnails (one per image, decoded, laid out) and the required fields."""

    def thumbnails() -> list[dict[str, Any]] | None:
        found = driver.execute_script(IMAGES_JS, form, DATA_JPEG)
        return found if len(found) >= images else None

    try:
        found = wait_for(f"{images} data:image/jpeg thumbnails", thumbnails, 30)
    except CheckFailed:
        srcs = driver.execute_script(
            "return [...arguments[0].querySelectorAll('img')].map(i => "
            "(i.getAttribute('src') || '').slice(0, 30))",
            form,
        )
        raise CheckFailed(
            f"{ui.name}: the form has {len(srcs)} img elements, too few with a {DATA_JPEG} "
            f"src for {images} images (srcs: {srcs}); does the UI strip data: URIs from the "
            "description's Markdown?"
        ) from None

    def decoded() -> list[dict[str, Any]] | None:
        now = driver.execute_script(IMAGES_JS, form, DATA_JPEG)
        return now if all(i["complete"] and i["natural_width"] > 0 for i in now) else None

    try:
        found = wait_for("the thumbnails to decode", decoded, 20)
    except CheckFailed:
        broken = [i["alt"] for i in found if not i["natural_width"]]
        raise CheckFailed(f"{ui.name}: thumbnails the browser did not decode: {broken}") from None
    if len(found) != images:
        raise CheckFailed(f"{ui.name}: the form shows {len(found)} thumbnails for {images} images")
    if sorted(i["alt"] for i in found) != sorted(labels):
        raise CheckFailed(
            f"{ui.name}: thumbnail labels {[i['alt'] for i in found]}, expected {labels}"
        )
    hidden = [i["alt"] for i in found if i["shown_width"] < 8 or i["shown_height"] < 8]
    if hidden:
        raise CheckFailed(f"{ui.name}: thumbnails laid out with no size (not visible): {hidden}")

    lines = [line.strip() for line in form.text.splitlines()]
    for field in ("Decision", "Reviewer", PICK_FIELD):
        if f"{field} (Optional)" in lines or field not in lines:
            raise CheckFailed(f"{ui.name}: the {field.lower()} field is not shown as required")
    if "Note (Optional)" not in lines:  # else the check above proves nothing
        raise CheckFailed(f"{ui.name}: optional fields are no longer marked '(Optional)'")
    return found


def browser_logs(driver: Any) -> tuple[list[str], list[str]]:
    """Console errors, and the URLs of requests to anything but this machine, since the last
    call (reading the logs empties them)."""
    errors: list[str] = []
    off_machine: list[str] = []
    with contextlib.suppress(Exception):
        errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    with contextlib.suppress(Exception):
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") != "Network.requestWillBeSent":
                continue
            url = message["params"]["request"]["url"]
            parts = urlsplit(url)
            if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in (
                "127.0.0.1",
                "localhost",
            ):
                off_machine.append(url)
    return errors, sorted(set(off_machine))


def check_ui(
    driver: Any, server: PrefectServer, ui: Ui, flow_run_id: str, images: int, labels: list[str]
) -> dict[str, Any]:
    """One UI: the page, the form, the checks, a screenshot (also on failure)."""
    report: dict[str, Any] = {"ui": ui.name, "screenshot": str(ui.screenshot.relative_to(REPO))}
    try:
        driver.get(server.ui_url + ui.path.format(id=flow_run_id))
        form = open_the_form(driver, ui)
        report["url"] = driver.current_url
        report["thumbnails"] = check_the_form(driver, ui, form, images, labels)
        return report
    finally:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(ui.screenshot))
        with contextlib.suppress(Exception):
            (OUT_DIR / f"page-{ui.name}.html").write_text(driver.page_source)
        report["console_errors"], report["off_machine_requests"] = browser_logs(driver)
        (OUT_DIR / f"report-{ui.name}.json").write_text(json.dumps(report, indent=2) + "\n")


def describe(report: dict[str, Any], images: int) -> str:
    thumbs = report["thumbnails"]
    loaded = sum(1 for i in thumbs if i["natural_width"] > 0)
    sizes = ",".join(sorted({f"{i['natural_width']}x{i['natural_height']}" for i in thumbs}))
    hosts = sorted({urlsplit(u).hostname or "?" for u in report["off_machine_requests"]})
    return (
        f"{report['ui']}: {len(thumbs)}/{images} thumbnails in the form, {loaded} loaded "
        f"({sizes} px), decision+reviewer+hero pick required, "
        f"screenshot {report['screenshot']}, "
        f"{len(report['console_errors'])} console errors, "
        f"off-machine requests: {', '.join(hosts) or 'none'}"
    )


# --------------------------------------------------------------------------------------------


def main() -> int:
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _sigterm)
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        print(
            f"ui-check: FAILED: {CHROMIUM} or {CHROMEDRIVER} missing "
            "(`make ui-check` installs Debian's chromium and chromium-driver)",
            file=sys.stderr,
        )
        return 1
    try:
        import selenium  # noqa: F401
    except ImportError:
        print(
            "ui-check: FAILED: selenium is not installed (`make ui-check` syncs the 'ui' group)",
            file=sys.stderr,
        )
        return 1

    work = Path(tempfile.mkdtemp(prefix="episodic-ui-check-"))
    server = PrefectServer(work / "stack", late_runs=False)
    ok = False
    try:
        for old in OUT_DIR.glob("*"):  # no stale screenshot passes for a new one
            if old.is_file():
                old.unlink()
        server.start()
        say(f"prefect server (with UI) up at {server.ui_url} in {server.started_in:.1f}s")
        point_this_process_at(server, work / "home")
        flow_run_id, images, labels = suspend_a_run_at_its_approval_form(work)
        flush_prefect()
        say(f"flow run {flow_run_id} suspended at its approval form ({images} images)")
        with chromium(work) as driver:
            reports = [check_ui(driver, server, ui, flow_run_id, images, labels) for ui in UIS]
        print(
            f"ui-check: OK: the approval form of flow run {flow_run_id} shows the images; "
            + "; ".join(describe(r, images) for r in reports)
            + f"; {time.monotonic() - began:.1f}s",
            flush=True,
        )
        ok = True
        return 0
    except CheckFailed as exc:
        print(f"ui-check: FAILED: {exc} (work folder kept: {work})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ui-check: interrupted (work folder kept: {work})", file=sys.stderr)
        return 130
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"ui-check: FAILED: {type(exc).__name__}: {first} (work folder kept: {work})",
            file=sys.stderr,
        )
        return 1
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
