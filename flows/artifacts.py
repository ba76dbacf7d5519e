"""Artifacts that describe the episode, not the last run (keys `episode-{id}-{what}`).

Every figure comes from the ledger (`episodic.pipeline.report.episode_report`): a resume that pays
nothing shows the episode's cumulative paid calls and cost, and a finished episode reads 100%.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    ProgressArtifact,
    TableArtifact,
    create_markdown_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.client.schemas.sorting import ArtifactSort
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.utilities.context import get_task_and_flow_run_ids
from sqlalchemy import Engine

from episodic.core.settings import load_settings
from episodic.pipeline.report import episode_report
from episodic.pipeline.thumbnails import thumbnail_data_uri
from episodic.providers.profiles import configured_profiles

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


def cost_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The `-cost` table: what was billed, and what was bought and is not billed yet (the
    provider's accepted jobs nobody collected: committed spend, some still running)."""
    return [
        {
            "episode": report["episode_id"],
            "state": report["state"],
            "images done": f"{report['completed']} of {report['planned']}",
            "paid calls": report["paid_submissions"],
            "cost": report["cost"],
            "committed": report["committed"],
            "still running": report["still_running"],
            "cancelled at the provider": report["cancelled_at_provider"],
        }
    ]


def publish_spend(
    engine: Engine, pipeline: str, episode_id: str, *, flow_run_id: UUID | None = None
) -> dict[str, Any]:
    """The episode's cost table and progress artifacts (cumulative over every run, so a run
    that paid nothing still shows the episode's spend, and a finished plan reads 100%);
    returns the report. One card of each per flow run (`upsert_artifact`): publishing
    again updates it. `flow_run_id`: the flow run to publish on (default: the current
    one; a cancellation hook publishes on the run it settled)."""
    report = episode_report(engine, pipeline, episode_id, prices=profile_prices())
    upsert_artifact(
        artifact_key(episode_id, "progress"),
        "progress",
        ProgressArtifact(progress=report["percent"]).format(),
        f"episode {episode_id}: planned images completed",
        flow_run_id,
    )
    upsert_artifact(
        artifact_key(episode_id, "cost"),
        "table",
        TableArtifact(table=cost_rows(report)).format(),
        f"episode {episode_id}: every paid call and its cost so far (the ledger); "
        "committed adds the accepted jobs not collected yet, at the profile's price",
        flow_run_id,
    )
    return report


def week_spend_key(pipeline: str, week_id: str) -> str:
    """``spend-{pipeline}-{week}``: the pipeline's name with ``_`` and ``.`` as dashes (a
    key allows lowercase letters, digits and dashes)."""
    return f"spend-{re.sub(r'[^a-z0-9-]', '-', pipeline)}-{week_id.lower()}"


def week_spend_rows(report: dict[str, Any], week_id: str) -> list[dict[str, Any]]:
    """The week's spend table: one row per profile and currency, then a total per currency
    (never summed across currencies), exact amounts."""
    from episodic.core.money import format_money

    def row(profile: str, figures: dict[str, Any]) -> dict[str, Any]:
        currency = figures["currency"]
        return {
            "week": week_id,
            "profile": profile,
            "currency": currency,
            "paid calls": figures["calls"],
            "spent": format_money(figures["spent_micros"], currency),
            "in flight": figures["in_flight_calls"],
            "reserved": format_money(figures["in_flight_micros"], currency),
        }

    rows = [row(group["group"], group) for group in report["groups"]]
    return rows + [row("(total)", total) for total in report["totals"]]


def publish_week_spend(
    engine: Engine, pipeline: str, week_id: str, *, flow_run_id: UUID | None = None
) -> dict[str, Any] | None:
    """The pipeline's spend in ISO week `week_id` (its timezone; `episodic spend
    --group-by profile` of that week) as a table artifact, one card per flow run; returns the report
    (None when it could not be read: a view is never the run's failure)."""
    from episodic.pipeline.spend import week_spend

    try:
        report = week_spend(engine, pipeline, week_id)
    except Exception as exc:
        _warn("the week's spend not read: %s", _described(exc))
        return None
    upsert_artifact(
        week_spend_key(pipeline, week_id),
        "table",
        TableArtifact(table=week_spend_rows(report, week_id)).format(),
        f"pipeline {pipeline}, week {week_id} ({report['pipelines'].get(pipeline, 'UTC')}): "
        "paid calls and their exact cost per profile and currency (the ledger, every run); "
        "in flight: open calls at what each was reserved at",
        flow_run_id,
    )
    return report


def profile_prices() -> dict[str, tuple[int, str]]:
    """Each provider profile's estimate per image (micro-units), for committed spend; empty
    when the profiles cannot be read (committed then counts the billed cost only)."""
    try:
        settings = load_settings()
        profiles = configured_profiles(settings)
        return {p.id: (p.pricing.estimate_micros, p.currency) for p in profiles.values()}
    except Exception as exc:  # a view: a broken profiles file is reported elsewhere
        _warn("provider prices not read: %s", _described(exc))
        return {}


def upsert_artifact(
    key: str,
    kind: str,
    data: Any,
    description: str,
    flow_run_id: UUID | None = None,
) -> UUID | None:
    """One artifact of `key` per flow run: the run's card is updated in place when it is
    the key's latest, else replaced by a new one (so the key's latest is always the newest
    figure); created when the run has none. Returns its id (None outside a flow run with
    no `flow_run_id`: nothing is published). A failure is logged, never raised.

    Creating an artifact for every publication (as `create_progress_artifact` and
    `create_table_artifact` do) gave a run one card per call: the live progress card frozen
    at its last update beside the final one, the weekly run a cost card per step."""
    if flow_run_id is None:
        _, flow_run_id = get_task_and_flow_run_ids()
    if flow_run_id is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            by_key = ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            latest = client.read_artifacts(
                artifact_filter=by_key, sort=ArtifactSort.CREATED_DESC, limit=1
            )
            mine = client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[key]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                ),
                sort=ArtifactSort.CREATED_DESC,
            )
            if mine and latest and latest[0].id == mine[0].id:
                client.update_artifact(
                    mine[0].id, ArtifactUpdate(data=data, description=description)
                )
                for older in mine[1:]:
                    client.delete_artifact(older.id)
                return mine[0].id
            created = client.create_artifact(
                ArtifactCreate(
                    key=key, type=kind, data=data, description=description, flow_run_id=flow_run_id
                )
            )
            for older in mine:
                client.delete_artifact(older.id)
            return created.id
    except Exception as exc:  # an artifact is a view: never the run's failure
        _warn("artifact %s not published: %s", key, _described(exc))
        return None


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
            self.artifact_id = upsert_artifact(
                artifact_key(episode_id, "progress"),
                "progress",
                ProgressArtifact(progress=self.percent).format(),
                f"episode {episode_id}: planned images completed",
            )
            if self.artifact_id is None:
                return
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


def _image_cell(content: bytes | None, name: str, label: str) -> str:
    uri = thumbnail_data_uri(content)
    return f"![{label}]({uri})" if uri else f"`{name}` (no preview)"


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
    engine: Engine,
    pipeline: str,
    episode_id: str,
    assembled: dict[str, Any],
    cover: bytes | None = None,
) -> None:
    """The assembly record with the cover shown (`cover`: its bytes from the media store;
    None: named, not shown)."""
    report = episode_report(engine, pipeline, episode_id)
    lines = [
        f"## Episode {episode_id}: assembled",
        "",
        _image_cell(cover, str(assembled["cover"]), "cover"),
        "",
        f"- cover: `{assembled['cover']}`",
        f"- manifest: `{assembled.get('manifest', '')}`",
        f"- media store: `{assembled.get('store', '')}`",
        f"- images: {report['completed']}, paid calls {report['paid_submissions']}, "
        f"cost {report['cost']}",
    ]
    create_markdown_artifact(
        key=artifact_key(episode_id, "assembly"),
        markdown="\n".join(lines),
        description=f"episode {episode_id}: the assembled media",
    )
