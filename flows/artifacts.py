"""Artifacts that describe the episode, not the last run (keys `episode-{id}-{what}`).

Every figure comes from the ledger (`pipeline.report.episode_report`): a resume that pays
nothing shows the episode's cumulative paid calls and cost, and a finished episode reads 100%.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from sqlalchemy import Engine

from pipeline.report import episode_report
from pipeline.thumbnails import thumbnail_data_uri

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&])")


def md_text(text: object, limit: int = 500) -> str:
    """People's text shown inside Markdown (a reviewer's name, a note, a refusal that quotes
    them) as plain text: one line, every Markdown and HTML character escaped, so nobody can
    forge a heading, a link or an image (a tracking pixel) in an artifact or a form."""
    flat = " ".join(str(text).split())
    if len(flat) > limit:
        flat = flat[:limit] + "…"
    return _MARKDOWN_SPECIAL.sub(r"\\\1", flat)


def artifact_key(episode_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return f"episode-{episode_id.lower()}-{what}"


def publish_spend(engine: Engine, pipeline: str, episode_id: str) -> dict[str, Any]:
    """The episode's cost table and progress artifacts (cumulative over every run, so a run
    that paid nothing still shows the episode's spend, and a finished plan reads 100%);
    returns the report."""
    report = episode_report(engine, pipeline, episode_id)
    create_progress_artifact(
        report["percent"],
        key=artifact_key(episode_id, "progress"),
        description=f"episode {episode_id}: planned images completed",
    )
    create_table_artifact(
        key=artifact_key(episode_id, "cost"),
        table=[
            {
                "episode": episode_id,
                "state": report["state"],
                "images done": f"{report['completed']} of {report['planned']}",
                "paid calls": report["paid_submissions"],
                "cost": report["cost"],
            }
        ],
        description=f"episode {episode_id}: every paid call and its cost so far (the ledger)",
    )
    return report


_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/@\s'\"]*@)?([^\s'\"?#]*)(?:[?#][^\s'\"]*)?")


def _described(exc: BaseException) -> str:
    """An error as one line for a warning: its first line, or its type; a URL in it keeps
    its scheme, host and path, never its user information or query (an API URL may carry
    credentials there)."""
    text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _URL.sub(r"\1\2", text)


def _warn(text: str, *args: object) -> None:
    try:
        logger: Any = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger(__name__)
    logger.warning(text, *args)


class EpisodeProgress:
    """A progress artifact that starts from what the episode already has done; after its
    creation it is published from a thread of its own, and `completed_one` only counts.

    Each publication is an API call (5 ms of CPU and 15-50 ms here); made on the flow's
    dispatching thread, as before, it stalled the claims of every slot that freed meanwhile.
    The artifact is created here, before the run's first item, on the caller's thread; the
    publisher then updates it with the latest figure at most twice a second, and `close`
    stops it and waits for an update in flight (an update makes its artifact the key's
    latest again, so one that landed after the flow's final figure, `publish_spend`, would
    replace it). A failed creation or publication is logged once and never fails the run.
    """

    MIN_INTERVAL_S = 0.5

    def __init__(self, engine: Engine, pipeline: str, episode_id: str) -> None:
        self.episode_id = episode_id
        self.planned = 1
        self.done = 0
        self.artifact_id: UUID | None = None
        self.published: list[float] = []  # what the publisher sent, in order
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            report = episode_report(engine, pipeline, episode_id)  # before any item runs
            self.planned = max(1, int(report["planned"]))
            self.done = int(report["completed"])
            self.artifact_id = create_progress_artifact(  # type: ignore[assignment]
                self.percent,
                key=artifact_key(episode_id, "progress"),
                description=f"episode {episode_id}: planned images completed",
            )
            # Prefect's settings and client live in context variables: the publisher runs
            # in a copy of this context, so it talks to this flow run's API.
            context = contextvars.copy_context()
            thread = threading.Thread(
                target=context.run, args=(self._publish,), name="episode-progress", daemon=True
            )
            thread.start()
            self._thread = thread
        except Exception as exc:  # an artifact is a view: never the run's failure
            _warn("episode %s: progress artifact not published: %s", episode_id, _described(exc))

    @property
    def percent(self) -> float:
        with self._lock:
            return min(100.0, 100.0 * self.done / self.planned)

    def completed_one(self) -> None:
        """Count one completed item (returns at once; the publisher sends it)."""
        with self._lock:
            self.done += 1
        self._changed.set()

    def close(self) -> None:
        """Stop the publisher, after the update in flight if any (bounded by the Prefect
        client's own timeout and retries, as the flow's final figures are)."""
        self._closed.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join()

    def _publish(self) -> None:
        sent = self.percent
        try:
            while not self._closed.is_set():
                self._changed.wait()
                self._changed.clear()
                if self._closed.is_set():
                    return
                if (percent := self.percent) != sent:
                    update_progress_artifact(self.artifact_id, percent)  # type: ignore[arg-type]
                    self.published.append(percent)
                    sent = percent
                self._closed.wait(self.MIN_INTERVAL_S)
        except Exception as exc:
            _warn("episode %s: progress artifact not updated: %s", self.episode_id, _described(exc))


def _image_cell(path: str, label: str) -> str:
    uri = thumbnail_data_uri(Path(path))
    return f"![{label}]({uri})" if uri else f"`{Path(path).name}` (no preview)"


def publish_decision(
    engine: Engine, pipeline: str, episode_id: str, decision: dict[str, Any]
) -> None:
    """The decision as a Markdown artifact: who decided what, when, on how many images."""
    report = episode_report(engine, pipeline, episode_id)
    lines = [
        f"## Episode {episode_id}: {decision['decision']}",
        "",
        f"- decided by: {md_text(decision['by'])}",
        f"- note: {md_text(decision.get('note') or '(none)')}",
        f"- images: {decision.get('images', report['completed'])}",
        f"- paid calls: {report['paid_submissions']}, cost {report['cost']}",
        f"- episode state: {report['state']}",
    ]
    if decision.get("picks"):
        shipped = ", ".join(f"{video} candidate {n}" for video, n in decision["picks"].items())
        lines.append(f"- hero picks: {md_text(shipped)}")
    create_markdown_artifact(
        key=artifact_key(episode_id, "decision"),
        markdown="\n".join(lines),
        description=f"episode {episode_id}: the approval decision",
    )


def publish_assembly(
    engine: Engine, pipeline: str, episode_id: str, assembled: dict[str, Any]
) -> None:
    """The assembly record with the cover shown."""
    report = episode_report(engine, pipeline, episode_id)
    lines = [
        f"## Episode {episode_id}: assembled",
        "",
        _image_cell(str(assembled["cover"]), "cover"),
        "",
        f"- cover: `{assembled['cover']}`",
        f"- manifest: `{assembled.get('manifest', '')}`",
        f"- images: {report['completed']}, paid calls {report['paid_submissions']}, "
        f"cost {report['cost']}",
    ]
    create_markdown_artifact(
        key=artifact_key(episode_id, "assembly"),
        markdown="\n".join(lines),
        description=f"episode {episode_id}: the assembled media",
    )
