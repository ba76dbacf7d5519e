"""The approval form in the real Prefect UI: images, rejection, Retry (``make ui-check``).

Does a person approving an episode see the images, and does a rejection stand a Retry?

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
   errors, requests the page tried to send off the machine) beside them;
5. rejects: fills the v1 form (decision reject, a reviewer, a note), submits, runs the
   resumed run as a worker would and checks it ends ``Completed`` named "Rejected" with a
   message naming the reviewer and the note, read back from the API and shown on both UIs'
   run pages (state badge and Prefect's "Finished in state Rejected(...)" log line);
   screenshots ``rejected-run.png`` and ``rejected-run-v2.png``;
6. retries: clicks Retry on the rejected run's v1 page and Retry in its confirmation, runs the
   retried run and checks it ends Rejected again ("the rejection stands", who and why) with
   no new form (no Paused/Suspended state, no form keyset after the Retry), the episode still
   ``rejected`` in our database and no new provider job (the fake provider's job files and
   its log of create calls); screenshot ``retried-run.png``, ``report-reject-retry.json``;
   and prints one summary line.

Every wait is for a condition (the page, the API, the database), never a fixed sleep.

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
REJECTED_SHOT = OUT_DIR / "rejected-run.png"
REJECTED_SHOT_V2 = OUT_DIR / "rejected-run-v2.png"
RETRIED_SHOT = OUT_DIR / "retried-run.png"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TITLES = ["first light", "second wind", "third act"]
HERO = {3: 3}  # the third video is a hero run of 3 candidates: the reviewer picks one
IMAGES = 2 + 3
PICK_FIELD = "v03: the candidate that ships"
MONDAY = datetime(2026, 8, 3, tzinfo=UTC)  # 2026-W32
DATA_JPEG = "data:image/jpeg;base64,"
REVIEWER = "Rita Reviewer"
NOTE = "too dark for the opening, re-plan v02"
WAIT_S = 180.0  # a bound, not a pause: every wait ends when its condition holds
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
    # the fake provider's own record of every create call that reached it
    os.environ["EPISODIC_FAKE_PROVIDER_LOG"] = str(home / "provider.jsonl")
    import episodic.tasks  # noqa: F401  (the project's Prefect defaults first)

    importlib.import_module("prefect.main")  # then Prefect, which configures its logging

    # Prefect's console output of the in-process run would drown the summary; the run's
    # logs still go to the server (the API handler is untouched).
    for logger in (logging.getLogger(), logging.getLogger("prefect")):
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.setLevel(logging.WARNING)


def the_slot_run(deployment: Any, start: datetime, end: datetime) -> Any:
    """The one run of the deployment's slot between `start` and `end`, scheduled now. Not
    every run of the deployment: the server's scheduler adds its future runs (from today on)
    at any moment, so unpacking them all failed 1 run in 3 ("too many values to unpack")."""
    from episodic.flows import local

    runs = [
        run
        for run in local.schedule_slots(deployment, start, end)
        if run.expected_start_time is not None and start <= run.expected_start_time <= end
    ]
    if len(runs) != 1:
        raise CheckFailed(f"expected one run of the slot {start:%Y-%m-%d}, found {len(runs)}")
    return runs[0]


def suspend_a_run_at_its_approval_form(work: Path) -> tuple[str, int, list[str]]:
    """A weekly slot run of a 3-video playlist (5 images), suspended at its form. Returns the
    flow run id, the number of images of the episode and the previews' labels in the form."""
    from prefect.client.orchestration import get_client
    from prefect.schedules import Cron

    from episodic.flows import local
    from episodic.flows.weekly import weekly_episode
    from tests.generation import write_playlist

    playlist = write_playlist(work / "playlist", TITLES, hero=HERO)
    schedule = Cron("0 9 * * 1", timezone="UTC", slug="ui-check-slot")
    deployment = local.apply_deployment(
        weekly_episode, "ui-check", schedule, parameters={"playlist": str(playlist)}
    )
    run = the_slot_run(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
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
        found = wait_for(f"{images} data:image/jpeg thumbnails", thumbnails)
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
        found = wait_for("the thumbnails to decode", decoded)
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


# --------------------------------------------------------------------------------------------
# the rejection, and a Retry of the rejected run
# --------------------------------------------------------------------------------------------


def _field(form: Any, label: str, control: str) -> Any:
    """The input (``control``: textarea, select, input) of the form's field labelled ``label``
    (a ``(Optional)`` suffix allowed)."""
    from selenium.webdriver.common.by import By

    xpath = (
        ".//*[contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property ')]"
        f"[.//*[contains(@class, 'schema-form-property__label')][normalize-space(.)='{label}'"
        f" or normalize-space(.)='{label} (Optional)']]//{control}"
    )
    for element in form.find_elements(By.XPATH, xpath):
        if element.is_displayed():
            return element
    return None


def flow_run(flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)  # type: ignore[arg-type]


def state_of(flow_run_id: str) -> Any:
    state = flow_run(flow_run_id).state
    if state is None:
        raise CheckFailed(f"flow run {flow_run_id} has no state")
    return state


def states_of(flow_run_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(flow_run_id)  # type: ignore[arg-type]
    return sorted(states, key=lambda s: s.timestamp)


def type_into(form: Any, label: str, control: str, value: str) -> None:
    element = wait_for(f"v1: the {label} field", lambda: _field(form, label, control))
    element.clear()
    element.send_keys(value)
    wait_for(
        f"v1: the {label} field to hold what was typed",
        lambda: element.get_attribute("value") == value,
    )


def reject_in_the_form(driver: Any, server: PrefectServer, flow_run_id: str) -> None:
    """v1: Resume, fill the form to reject with a reviewer and a note, Submit; returns once
    the server took the answer (the run left its suspended state)."""
    from selenium.webdriver.support.ui import Select

    driver.get(server.ui_url + UIS[0].path.format(id=flow_run_id))
    form = open_the_form(driver, UIS[0])
    select = wait_for("v1: the decision field's select", lambda: _field(form, "Decision", "select"))
    Select(select).select_by_value("reject")
    wait_for("v1: the decision to read reject", lambda: select.get_attribute("value") == "reject")
    for label, control, value in (
        ("Reviewer", "textarea", REVIEWER),
        ("Note", "textarea", NOTE),
        (PICK_FIELD, "input", "1"),  # required by the form; ignored when rejecting
    ):
        type_into(form, label, control, value)
    wait_for(
        "v1: the form's Submit button",
        lambda: displayed(driver, FORM_XPATH + "//button[normalize-space(.)='Submit']"),
    ).click()

    def answered() -> bool:
        return not state_of(flow_run_id).is_paused()

    try:
        wait_for("the server to take the form's answer (the run no longer Suspended)", answered)
    except CheckFailed:
        toasts = driver.execute_script(
            "return [...document.querySelectorAll('.p-toast')].map(t => t.innerText)"
        )
        raise CheckFailed(f"the rejection was not taken; the UI said: {toasts}") from None


def executed(flow_run_id: str) -> Any:
    """Run the flow run in this process, as a worker would, and send its logs."""
    from episodic.flows import local
    from episodic.flows.weekly import weekly_episode

    state = local.execute(weekly_episode, flow_run_id)  # type: ignore[arg-type]
    flush_prefect()
    return state


def rejected_as_answered(state: Any, what: str) -> None:
    """A Completed state named Rejected whose message names the reviewer and the note."""
    message = state.message or ""
    if not (state.is_completed() and state.name == "Rejected"):
        raise CheckFailed(f"{what} ended {state.type.value} {state.name!r}, not Rejected")
    if REVIEWER not in message or NOTE not in message:
        raise CheckFailed(f"{what}: its state's message does not say who and why: {message!r}")


def page_shows_rejected(
    driver: Any, server: PrefectServer, ui: Ui, flow_run_id: str, also: str = ""
) -> None:
    """The run page's state badge says Rejected and the page (its logs: Prefect's "Finished in
    state Rejected('…')") shows who and why, and ``also`` (the retried run's own words)."""

    def badge() -> Any:
        return displayed(
            driver,
            "//*[contains(@class,'state-badge') or self::span][normalize-space(.)='Rejected']",
        )

    def words() -> bool:
        text = driver.find_element("tag name", "body").text
        return REVIEWER in text and NOTE in text and also in text

    driver.get(server.ui_url + ui.path.format(id=flow_run_id))
    wait_for(f"{ui.name}: the run page's state badge 'Rejected'", badge)
    wait_for(
        f"{ui.name}: the run page to show who rejected and why ({REVIEWER}: {NOTE}) {also}", words
    )


def click_retry(driver: Any, server: PrefectServer, flow_run_id: str) -> None:
    """v1: the header's Retry, then Retry in its confirmation ("Retry NAME?"); returns once
    the server holds the run Scheduled again (AwaitingRetry)."""
    driver.get(server.ui_url + UIS[0].path.format(id=flow_run_id))
    wait_for(
        "v1: the Retry button on the rejected run's page",
        lambda: displayed(driver, "//button[normalize-space(.)='Retry']"),
    ).click()
    wait_for(
        "v1: Retry in the 'Retry …?' confirmation",
        lambda: displayed(
            driver,
            "//*[contains(@class,'p-modal__card')][.//*[starts-with(normalize-space(.),'Retry ')]]"
            "//button[normalize-space(.)='Retry']",
        ),
    ).click()

    def scheduled_again() -> bool:
        state = state_of(flow_run_id)
        return bool(state.is_scheduled() and state.name == "AwaitingRetry")

    wait_for("the server to hold the run for its retry (Scheduled, AwaitingRetry)", scheduled_again)


def provider_jobs(home: Path) -> tuple[int, int]:
    """(job files the fake provider keeps, create calls its log recorded)."""
    files = len(list(home.rglob("fake-provider/*.json")))
    log = home / "provider.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    calls = sum(1 for line in lines if line and json.loads(line).get("event") == "submit")
    return files, calls


def episode_state() -> str:
    from episodic.core.settings import load_settings
    from episodic.storage.engine import make_engine
    from episodic.storage.episodes import EpisodeRepository

    engine = make_engine(load_settings().url)
    try:
        episodes = EpisodeRepository(engine).list("weekly")
    finally:
        engine.dispose()
    if len(episodes) != 1:
        raise CheckFailed(f"{len(episodes)} episodes in the database, one expected")
    return str(episodes[0].state)


def shoot(driver: Any, path: Path) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        driver.save_screenshot(str(path))


def reject_then_retry(
    driver: Any, server: PrefectServer, flow_run_id: str, home: Path, images: int
) -> dict[str, Any]:
    """The rejection through the v1 form, then the UI's Retry of the rejected run: it ends
    Rejected again, saying who and why, with no new form, no new provider job."""
    report: dict[str, Any] = {}
    shot = REJECTED_SHOT
    try:
        reject_in_the_form(driver, server, flow_run_id)
        rejected_as_answered(executed(flow_run_id), "the answered run")
        rejected_as_answered(state_of(flow_run_id), "the answered run (read back from the API)")
        page_shows_rejected(driver, server, UIS[0], flow_run_id)
        shoot(driver, REJECTED_SHOT)
        shot = REJECTED_SHOT_V2
        page_shows_rejected(driver, server, UIS[1], flow_run_id)
        shoot(driver, REJECTED_SHOT_V2)
        if (state := episode_state()) != "rejected":
            raise CheckFailed(f"the rejected run's episode is {state!r} in the database")
        jobs_before = provider_jobs(home)
        if jobs_before != (images, images):
            raise CheckFailed(f"provider jobs (files, calls) {jobs_before}, {images} expected")

        shot = RETRIED_SHOT
        click_retry(driver, server, flow_run_id)
        retried_at = state_of(flow_run_id).timestamp
        again = executed(flow_run_id)
        if again.is_paused():
            raise CheckFailed("the retried rejected run suspended at a new approval form")
        rejected_as_answered(again, "the retried run")
        if "the rejection stands" not in (again.message or ""):
            raise CheckFailed(f"the retried run does not say the rejection stands: {again.message}")
        rejected_as_answered(state_of(flow_run_id), "the retried run (read back from the API)")
        forms = [
            s.name
            for s in states_of(flow_run_id)
            if s.timestamp >= retried_at and (s.is_paused() or s.state_details.run_input_keyset)
        ]
        if forms:
            raise CheckFailed(f"the retried run went through {forms}: a new form")
        if (state := episode_state()) != "rejected":
            raise CheckFailed(f"after the Retry the episode is {state!r} in the database")
        if (jobs_after := provider_jobs(home)) != jobs_before:
            raise CheckFailed(
                f"the Retry reached the provider: jobs (files, calls) {jobs_before} -> {jobs_after}"
            )
        page_shows_rejected(driver, server, UIS[0], flow_run_id, also="the rejection stands")
        shoot(driver, RETRIED_SHOT)
        report.update(
            message=again.message,
            provider_jobs=jobs_after[0],
            screenshots=[
                str(p.relative_to(REPO)) for p in (REJECTED_SHOT, REJECTED_SHOT_V2, RETRIED_SHOT)
            ],
        )
        return report
    finally:
        shoot(driver, shot)
        with contextlib.suppress(Exception):
            (OUT_DIR / f"page-{shot.stem}.html").write_text(driver.page_source)
        report["console_errors"], report["off_machine_requests"] = browser_logs(driver)
        (OUT_DIR / "report-reject-retry.json").write_text(json.dumps(report, indent=2) + "\n")


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
            say("both forms show the images; rejecting in the v1 form, then Retry")
            rejection = reject_then_retry(driver, server, flow_run_id, work / "home", images)
        print(
            f"ui-check: OK: the approval form of flow run {flow_run_id} shows the images; "
            + "; ".join(describe(r, images) for r in reports)
            + f"; rejected in the v1 form, Retry ended Rejected again ({rejection['message']}),"
            f" no new form, episode rejected, still {rejection['provider_jobs']} provider jobs,"
            f" screenshots {', '.join(rejection['screenshots'])}"
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
