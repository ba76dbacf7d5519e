"""`episodic demo`: the weekly flow on the embedded default, end to end, on this machine."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Annotated, Any

import typer

from cli import context
from cli.options import JsonOption
from cli.output import emit_json, table

DEMO_CRON = "0 9 * * 1,4"  # two releases a week: Monday and Thursday 09:00


def demo(
    week: Annotated[
        str | None, typer.Option(help="ISO week to run, e.g. 2026-W32 [default: this week].")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the weekly flow for two scheduled slots of one ISO week, then retry the first.

    The flow runs are created by Prefect's own scheduler endpoint for a deployment whose
    schedule has two slots a week, and executed in this process. Expected: the slots own
    WEEK-0 and WEEK-1, and the retry of the first slot gets WEEK-0 again.
    """
    import tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from core.ids import WeekId

    settings = context.settings()
    week_id = WeekId.parse(week) if week else WeekId.of(datetime.now(settings.tz), settings.tz)
    rows = _run(week_id, settings.timezone, settings.tz)
    if as_json:
        emit_json({"week_id": str(week_id), "runs": rows})
        return
    table(
        f"weekly_episode for {week_id} (pipeline {settings.pipeline}, database {settings.url})",
        ["invocation", "scheduled slot", "flow run", "state", "episode"],
        ((r["invocation"], r["slot"], r["flow_run"], r["state"], r["episode_id"]) for r in rows),
    )


def _run(week_id: Any, timezone: str, tz: Any) -> list[dict[str, Any]]:
    from prefect.client.schemas.objects import StateType
    from prefect.schedules import Cron

    from flows import local
    from flows.weekly import weekly_episode

    start = datetime.combine(week_id.monday(), time(0), tz)
    deployment_id = local.apply_deployment(
        weekly_episode,
        "demo-twice-weekly",
        Cron(DEMO_CRON, timezone=timezone, slug="demo-mon-thu"),
    )
    slots = local.schedule_slots(
        deployment_id, start, start + timedelta(days=7) - timedelta(seconds=1)
    )
    end = start + timedelta(days=7)
    slots = [r for r in slots if r.expected_start_time and start <= r.expected_start_time < end]
    rows: list[dict[str, Any]] = []

    def record(label: str, run: Any, state: Any) -> None:
        rows.append(
            {
                "invocation": label,
                "slot": run.expected_start_time.astimezone(tz).strftime("%a %Y-%m-%d %H:%M %Z"),
                "flow_run": str(run.id),
                "state": state.type.value,
                "episode_id": state.result(raise_on_failure=False)
                if state.is_completed()
                else None,
            }
        )

    for number, run in enumerate(slots[:2], start=1):
        # A rerun of the demo finds its slots already run: retrying them is the same story.
        fresh = run.state is not None and run.state.type == StateType.SCHEDULED
        state = (
            local.execute(weekly_episode, run.id) if fresh else local.retry(weekly_episode, run.id)
        )
        record(f"slot {number}", run, state)
    first = slots[0]
    record("retry of slot 1", first, local.retry(weekly_episode, first.id))
    return rows
