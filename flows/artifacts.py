"""Artifacts that describe the episode, not the last run (keys `episode-{id}-{what}`).

Every figure comes from the ledger (`pipeline.report.episode_report`): a resume that pays
nothing shows the episode's cumulative paid calls and cost, and a finished episode reads 100%.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
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


class EpisodeProgress:
    """A progress artifact that starts from what the episode already has done. Updated at
    most twice a second (each update is an API call on the flow's dispatching thread); the
    generate flow publishes the final figure when the run ends."""

    MIN_INTERVAL_S = 0.5

    def __init__(self, engine: Engine, pipeline: str, episode_id: str) -> None:
        report = episode_report(engine, pipeline, episode_id)
        self.planned: int = max(1, int(report["planned"]))
        self.done: int = int(report["completed"])
        self.artifact_id: UUID = create_progress_artifact(  # type: ignore[assignment]
            self.percent,
            key=artifact_key(episode_id, "progress"),
            description=f"episode {episode_id}: planned images completed",
        )
        self._published_at = time.monotonic()

    @property
    def percent(self) -> float:
        return min(100.0, 100.0 * self.done / self.planned)

    def completed_one(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self._published_at >= self.MIN_INTERVAL_S or self.done >= self.planned:
            self._published_at = now
            update_progress_artifact(self.artifact_id, self.percent)


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
