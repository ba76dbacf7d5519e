"""The approval form's titles and prompts, and a decision from either door (``make ui-check``).

In headless Chromium, on a real ``prefect server`` (the stack and browser of
``tests.ui.ui_check``):

    python -m tests.ui.decision_check

1. the form shows each video's title as a heading beside its images: the form's visible text
   holds every title of the playlist, each heading followed by exactly that video's
   thumbnails; the prompts are behind a ``<details>`` toggle, hidden until its summary is
   clicked, then shown (the playlist's prompt text); screenshot ``decision-form.png``;
2. an episode waiting at its form is approved on the command line, ``episodic approve E --by
   NAME`` in its own process with ``PREFECT_API_URL`` at the server and the same
   ``EPISODIC_HOME``: the run page then shows the run resumed (its state badge no longer
   Paused/Suspended), and once the run is executed as a worker would, ``Completed`` with the
   episode ``assembled`` in the database; screenshots ``cli-resumed-run.png``,
   ``cli-approved-run.png``;
3. a conflicting answer: another episode waiting, ``episodic approve`` without a Prefect API
   (the decision is recorded, nothing resumes), then a reviewer rejects in the v1 form; the
   resumed run, executed, suspends again and its new form's top (visible text, above the
   fields) says, once, that the answer was not recorded and that the command line's approval
   stands, and speaks of no images (it shows none);
   screenshot ``refused-answer-form.png``.

Prints one line (``ui-check: OK (decisions): ...``, or ``ui-check: FAILED: <reason>`` and exit
1, keeping the work folder). Screenshots, each failing page's HTML and ``report-decisions.json``
are in ``.episodic/ui-check`` (only this module's files there are replaced).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.e2e.stack import PrefectServer
from tests.ui.ui_check import (
    CHROMEDRIVER,
    CHROMIUM,
    DATA_JPEG,
    FORM_XPATH,
    HERO,
    MONDAY,
    OUT_DIR,
    REVIEWER,
    TITLES,
    UIS,
    CheckFailed,
    _sigterm,
    browser_logs,
    chromium,
    displayed,
    executed,
    flush_prefect,
    open_the_form,
    point_this_process_at,
    reject_in_the_form,
    say,
    state_of,
    the_slot_run,
    wait_for,
)

FORM_SHOT = OUT_DIR / "decision-form.png"
RESUMED_SHOT = OUT_DIR / "cli-resumed-run.png"
APPROVED_SHOT = OUT_DIR / "cli-approved-run.png"
REFUSED_SHOT = OUT_DIR / "refused-answer-form.png"
REPORT = OUT_DIR / "report-decisions.json"
APPROVER = "Carol Cli"
PICK = ("--pick", "v03=2")  # the hero video's candidate that ships
PROMPT = "cover for {title} part {part}"  # tests.generation.write_playlist's default
EPISODIC = Path(sys.executable).parent / "episodic"
SUSPENDED = ("Paused", "Suspended")

#: Each video's heading in the form, and the thumbnails between it and the next heading.
SECTIONS_JS = """
const form = arguments[0];
const heads = [...form.querySelectorAll('h3')];
return heads.map((h, n) => {
  const next = heads[n + 1];
  const imgs = [...form.querySelectorAll('img')].filter(i =>
    (i.getAttribute('src') || '').startsWith(arguments[1])
    && (h.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_FOLLOWING)
    && (!next || (next.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_PRECEDING)));
  return {heading: h.innerText, visible: h.getBoundingClientRect().height > 0,
          images: imgs.map(i => i.getAttribute('alt'))};
});
"""


# --------------------------------------------------------------------------------------------
# episodes waiting at their forms, the command line, the database
# --------------------------------------------------------------------------------------------


def waiting_runs(work: Path, weeks: int) -> list[tuple[str, str]]:
    """`weeks` weekly slot runs (one a week from 2026-W32) of the ui-check playlist, each
    suspended at its form: [(flow run id, episode id)]."""
    from prefect.schedules import Cron

    from episodic.flows import local
    from episodic.flows.weekly import weekly_episode
    from tests.generation import write_playlist

    playlist = write_playlist(work / "playlist", TITLES, hero=HERO, prompt=PROMPT)
    schedule = Cron("0 9 * * 1", timezone="UTC", slug="decision-check-slot")
    deployment = local.apply_deployment(
        weekly_episode, "decision-check", schedule, parameters={"playlist": str(playlist)}
    )
    found: list[tuple[str, str]] = []
    for week in range(weeks):
        start = MONDAY + timedelta(days=7 * week)
        run = the_slot_run(deployment, start, start + timedelta(days=7, seconds=-1))
        state = local.execute(weekly_episode, run.id)
        if not state.is_paused():
            raise CheckFailed(
                f"the slot run of {start:%Y-%m-%d} did not stop at its form: {state!r}"
            )
        new = [e for e in episodes() if e not in {episode for _, episode in found}]
        if len(new) != 1:
            raise CheckFailed(f"the slot run of {start:%Y-%m-%d} made episodes {new}, one expected")
        found.append((str(run.id), new[0]))
    flush_prefect()
    return found


def episodes() -> dict[str, str]:
    """The weekly pipeline's episodes in the database: id -> state."""
    from episodic.core.settings import load_settings
    from episodic.storage.engine import make_engine
    from episodic.storage.episodes import EpisodeRepository

    engine = make_engine(load_settings().url)
    try:
        return {str(e.episode_id): str(e.state) for e in EpisodeRepository(engine).list("weekly")}
    finally:
        engine.dispose()


def episodic(*args: str, api: bool) -> subprocess.CompletedProcess[str]:
    """The installed command in its own process, with this process's EPISODIC_HOME (the same
    database) and, if `api`, PREFECT_API_URL at the server (else no Prefect API at all)."""
    env = dict(os.environ)
    if not api:
        env.pop("PREFECT_API_URL", None)
        env["PREFECT_PROFILES_PATH"] = os.devnull  # no profile's URL either
    done = subprocess.run(
        [str(EPISODIC), *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CheckFailed(f"`episodic {' '.join(args)}` exited {done.returncode}: {last}")
    return done


# --------------------------------------------------------------------------------------------
# the browser
# --------------------------------------------------------------------------------------------


def shoot(driver: Any, path: Path) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        driver.save_screenshot(str(path))
    with contextlib.suppress(Exception):
        (OUT_DIR / f"page-{path.stem}.html").write_text(driver.page_source)


def close_the_form(driver: Any) -> None:
    """Leave the form unanswered: its Close button."""
    wait_for(
        "v1: the form's Close button",
        lambda: displayed(driver, FORM_XPATH + "//button[normalize-space(.)='Close']"),
    ).click()
    wait_for("the form to close", lambda: displayed(driver, FORM_XPATH) is None)


def titles_beside_images(driver: Any, server: PrefectServer, flow_run_id: str) -> dict[str, Any]:
    """v1's form: a heading with each title, followed by exactly its video's thumbnails; the
    prompts hidden in a <details> until its summary is clicked."""
    from selenium.webdriver.common.by import By

    driver.get(server.ui_url + UIS[0].path.format(id=flow_run_id))
    form = open_the_form(driver, UIS[0])
    text = form.text
    missing = [title for title in TITLES if title not in text]
    if missing:
        raise CheckFailed(f"the form's visible text lacks the titles {missing}")

    def sections() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = driver.execute_script(SECTIONS_JS, form, DATA_JPEG)
        return found if len(found) == len(TITLES) and all(s["images"] for s in found) else None

    found = wait_for(f"{len(TITLES)} video headings, each followed by thumbnails", sections)
    for n, (title, section) in enumerate(zip(TITLES, found, strict=True), start=1):
        video = f"v{n:02d}"
        if title not in section["heading"] or not section["visible"]:
            raise CheckFailed(f"heading {n} reads {section['heading']!r}, not the title {title!r}")
        strays = [alt for alt in section["images"] if not str(alt).startswith(f"{video}.")]
        if strays:
            raise CheckFailed(f"under the title {title!r} are thumbnails of other videos: {strays}")
    per_video = {s["heading"]: s["images"] for s in found}

    details = form.find_elements(By.TAG_NAME, "details")
    if len(details) != len(TITLES):
        raise CheckFailed(f"the form has {len(details)} <details> for {len(TITLES)} videos")
    prompt = PROMPT.format(title=TITLES[0], part=1)
    first = details[0]
    if first.get_attribute("open") is not None or prompt in form.text:
        raise CheckFailed("the first video's prompt is shown before its <details> is opened")
    summary = first.find_element(By.TAG_NAME, "summary")
    summary.click()
    wait_for("the <details> to open on a click", lambda: first.get_attribute("open") is not None)
    wait_for(f"the opened <details> to show the prompt {prompt!r}", lambda: prompt in first.text)
    shoot(driver, FORM_SHOT)
    close_the_form(driver)
    return {"per_video": per_video, "prompt_shown_on_click": prompt}


def badges(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        b.text.strip()
        for b in driver.find_elements(By.XPATH, "//*[contains(@class,'state-badge')]")
        if b.is_displayed() and b.text.strip()
    ]


def page_shows_state(driver: Any, server: PrefectServer, flow_run_id: str, name: str) -> None:
    """The v1 run page's state badge says `name` and none says Paused or Suspended."""
    driver.get(server.ui_url + UIS[0].path.format(id=flow_run_id))

    def shown() -> bool:
        now = badges(driver)
        return name in now and not any(s in now for s in SUSPENDED)

    try:
        wait_for(f"v1: the run page's state badge {name!r} (not Paused/Suspended)", shown)
    except CheckFailed as exc:
        raise CheckFailed(f"{exc}; the page's badges: {badges(driver)}") from None


def page_shows_suspended(driver: Any, server: PrefectServer, flow_run_id: str) -> None:
    """The v1 run page's state badge says Suspended: the run waits at a form again."""
    driver.get(server.ui_url + UIS[0].path.format(id=flow_run_id))
    try:
        wait_for(
            "v1: the run page's state badge 'Suspended'", lambda: "Suspended" in badges(driver)
        )
    except CheckFailed as exc:
        raise CheckFailed(f"{exc}; the page's badges: {badges(driver)}") from None


def approve_on_the_command_line(
    driver: Any, server: PrefectServer, flow_run_id: str, episode_id: str
) -> dict[str, Any]:
    """`episodic approve E --by NAME` resumes the waiting run; executed, it assembles."""
    done = episodic("approve", episode_id, "--by", APPROVER, *PICK, "--json", api=True)
    result = json.loads(done.stdout)
    if result.get("state") != "approved" or not (result.get("resumed") or {}).get("flow_run"):
        raise CheckFailed(f"`episodic approve {episode_id}` did not resume the run: {result}")
    resumed = state_of(flow_run_id)
    if resumed.is_paused():
        raise CheckFailed(f"after `episodic approve` the run is still {resumed.name}")
    page_shows_state(driver, server, flow_run_id, str(resumed.name))
    shoot(driver, RESUMED_SHOT)
    state = executed(flow_run_id)
    if not (state.is_completed() and state.name == "Completed"):
        raise CheckFailed(f"the resumed run ended {state.type.value} {state.name!r}")
    if (now := episodes().get(episode_id)) != "assembled":
        raise CheckFailed(f"after the resumed run, episode {episode_id} is {now!r}")
    page_shows_state(driver, server, flow_run_id, "Completed")
    assembled = f"assembled {episode_id}: cover"  # the run's log line, on the page
    wait_for(
        f"v1: the run page's log to say {assembled!r}",
        lambda: assembled in driver.find_element("tag name", "body").text,
    )
    shoot(driver, APPROVED_SHOT)
    return {"resumed_as": resumed.name, "cli": result["resumed"]["message"]}


def refused_answer_in_the_form(
    driver: Any, server: PrefectServer, flow_run_id: str, episode_id: str
) -> str:
    """Approved on the command line without a Prefect API (the run waits on); rejected in
    the form; the resumed run suspends again, its new form's top saying so. Returns that
    top line."""
    done = episodic("approve", episode_id, "--by", APPROVER, *PICK, api=False)
    if "no waiting flow run was resumed" not in done.stdout:
        raise CheckFailed(f"`episodic approve` without an API says: {done.stdout.strip()}")
    if not state_of(flow_run_id).is_paused():
        raise CheckFailed("`episodic approve` without a Prefect API resumed the run")
    reject_in_the_form(driver, server, flow_run_id)
    state = executed(flow_run_id)
    if not state.is_paused():
        raise CheckFailed(f"the run resumed with the losing answer ended {state.name!r}")
    if (now := episodes().get(episode_id)) != "approved":
        raise CheckFailed(f"the losing answer changed episode {episode_id} to {now!r}")
    page_shows_suspended(driver, server, flow_run_id)
    form = open_the_form(driver, UIS[0])
    wanted = (f"Your answer (reject by {REVIEWER}) was not recorded", f"approved by {APPROVER}")

    def top() -> str | None:
        text = form.text
        where = [text.find(w) for w in wanted]
        fields = text.find("Decision")
        return text if all(0 <= w < fields for w in where) else None

    try:
        text = wait_for(f"the new form's top to say {wanted}, above its fields", top)
    except CheckFailed:
        shoot(driver, REFUSED_SHOT)
        raise CheckFailed(
            f"the new form does not say {wanted} at its top: {form.text[:300]!r}"
        ) from None
    shoot(driver, REFUSED_SHOT)
    if text.count("not recorded") != 1:
        raise CheckFailed(f"the new form says 'not recorded' {text.count('not recorded')} times")
    if "images above" in text:  # this form shows no images
        raise CheckFailed(f"the new form speaks of images above it: {text[:400]!r}")
    line = next(line for line in text.splitlines() if wanted[0] in line)
    return line.strip()


# --------------------------------------------------------------------------------------------


def main() -> int:
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _sigterm)
    for needed in (CHROMIUM, CHROMEDRIVER, EPISODIC):
        if not needed.exists():
            print(f"ui-check: FAILED: {needed} missing (run `make ui-check`)", file=sys.stderr)
            return 1
    work = Path(tempfile.mkdtemp(prefix="episodic-decision-check-"))
    server = PrefectServer(work / "stack", late_runs=False)
    report: dict[str, Any] = {}
    ok = False
    try:
        for old in (FORM_SHOT, RESUMED_SHOT, APPROVED_SHOT, REFUSED_SHOT, REPORT):
            old.unlink(missing_ok=True)
        server.start()
        say(f"prefect server (with UI) up at {server.ui_url} in {server.started_in:.1f}s")
        point_this_process_at(server, work / "home")
        (first, approved), (second, conflicting) = waiting_runs(work, 2)
        say(f"episodes {approved} and {conflicting} wait at their forms")
        with chromium(work) as driver:
            try:
                report["form"] = titles_beside_images(driver, server, first)
                report["cli"] = approve_on_the_command_line(driver, server, first, approved)
                say(f"{approved}: approved on the command line, resumed, assembled")
                report["refused"] = refused_answer_in_the_form(driver, server, second, conflicting)
            finally:
                report["console_errors"], report["off_machine_requests"] = browser_logs(driver)
        print(
            f"ui-check: OK (decisions): the form shows the titles {TITLES} above their own "
            f"thumbnails, the prompt opens on a click; `episodic approve {approved}` resumed "
            f"its waiting run ({report['cli']['resumed_as']}), which completed and assembled; "
            f"{conflicting} approved without an API then rejected in the form: the run waits "
            f"again, its form saying {report['refused']!r}; screenshots "
            + ", ".join(
                str(p.relative_to(OUT_DIR.parents[1]))
                for p in (FORM_SHOT, RESUMED_SHOT, APPROVED_SHOT, REFUSED_SHOT)
            )
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
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"ui-check: FAILED: {type(exc).__name__}: {first_line} (work folder kept: {work})",
            file=sys.stderr,
        )
        return 1
    finally:
        with contextlib.suppress(Exception):
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            REPORT.write_text(json.dumps(report, indent=2, default=str) + "\n")
        with contextlib.suppress(Exception):
            server.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
