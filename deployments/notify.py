"""Prefect automations that tell a person something needs them (`episodic prefect setup
--notify BLOCK`): an approval form that has waited too long, and a flow run that failed.

Both send through a notification block saved on the Prefect server (a Slack, email or
webhook block...). They are named after the pipeline, so re-running the setup updates them
in place instead of adding duplicates. Their triggers run in the Prefect server's triggers
service (`prefect server start` runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from prefect.client.orchestration import get_client
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

from episodic.core.errors import InvalidInput
from episodic.deployments.spec import pipeline_tag

#: the flows of this project, whose failures are notified
FLOW_NAMES = (
    "weekly-episode",
    "generate-episode",
    "approve-episode",
    "assemble-episode",
    "plan-episode",
    "sweep",
)


def automation_names(pipeline: str) -> tuple[str, str]:
    """(the approval-wait automation's name, the failed-run automation's name)."""
    return f"episodic {pipeline}: approval waits", f"episodic {pipeline}: flow run failed"


def approval_waits(pipeline: str, block_id: Any, wait_s: int) -> AutomationCore:
    """Fires once per flow run of `pipeline` (tagged ``pipeline:PIPELINE``) that stays
    Suspended (or Paused: our flows pause only at an approval form) for `wait_s` seconds.

    It matches the pipeline tag the run carries from its creation (the deployment's tags,
    `episodic.deployments.spec.DeploymentSpec.tags`, which Prefect copies onto every run: scheduled,
    Quick run, Retry), never the approval tag the flow adds just before it suspends: the
    server builds an event's related resources, tags included, from a copy of the run cached
    when the run first changed state (``PREFECT_API_EVENTS_RELATED_RESOURCE_CACHE_TTL``,
    five minutes by default), so a tag added later is missing from the Suspended event of a
    run's first wait. Only state-change events count, before and after the wait: a
    heartbeat the run's process sent as it exited would otherwise end the wait unseen."""
    name, _ = automation_names(pipeline)
    return AutomationCore(
        name=name,
        description=f"An approval of pipeline {pipeline} has waited {wait_s} s (episodic).",
        trigger=EventTrigger(
            # state changes only: a run's heartbeat (no state type) arriving after it
            # suspended would count as "it moved on" and silence the notification
            match={"prefect.resource.id": "prefect.flow-run.*", "prefect.state-type": "*"},
            match_related={
                "prefect.resource.role": "tag",
                "prefect.resource.id": f"prefect.tag.{pipeline_tag(pipeline)}",
            },
            after={"prefect.flow-run.Suspended", "prefect.flow-run.Paused"},
            expect={"prefect.flow-run.*"},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=wait_s),
        ),
        actions=[
            SendNotification(
                block_document_id=block_id,
                subject="episodic: an approval waits ({{ flow_run.name }})",
                body=(
                    "Flow run {{ flow_run.name }} has waited at its approval form for "
                    f"{_human(wait_s)}. Answer it in the Prefect UI (Resume) or decide on the "
                    "command line: episodic approve EPISODE --by NAME (or --reject --reason "
                    "TEXT), which resumes the run."
                ),
            )
        ],
    )


def run_failed(pipeline: str, block_id: Any) -> AutomationCore:
    """Fires once per flow run of this project's flows that ends Failed or Crashed."""
    _, name = automation_names(pipeline)
    return AutomationCore(
        name=name,
        description="A flow run of episodic's flows failed or crashed (episodic).",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": [*FLOW_NAMES]},
            expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            SendNotification(
                block_document_id=block_id,
                subject="episodic: flow run {{ flow_run.name }} {{ flow_run.state.name }}",
                body=(
                    "Flow run {{ flow_run.name }} ended {{ flow_run.state.name }}: "
                    "{{ flow_run.state.message }}"
                ),
            )
        ],
    )


def ensure_notifications(pipeline: str, block: str, wait_s: int) -> list[dict[str, Any]]:
    """Create or update both automations, sending through the notification block `block`
    (its name, or ``TYPE-SLUG/NAME``). Returns ``[{name, id, changed: created|updated}]``."""
    with get_client(sync_client=True) as client:
        block_id = _notification_block(client, block)
        done = []
        for automation in (
            approval_waits(pipeline, block_id, wait_s),
            run_failed(pipeline, block_id),
        ):
            done.append(_ensure(client, automation))
    return done


def _ensure(client: Any, automation: AutomationCore) -> dict[str, Any]:
    """Create or update the automation named `automation.name`, leaving exactly one.

    Concurrent setups converge: each keeps the one with the smallest id (every racer picks
    the same), deletes the others, and after creating reads back by name and deletes the
    extras (its own included, when another's id is smaller); a duplicate that another setup
    deleted meanwhile (404) is done."""
    for _ in range(5):
        existing = client.read_automations_by_name(automation.name)
        if existing:
            keep = min(existing, key=lambda found: str(found.id))
            if not _found(client.update_automation, keep.id, automation):
                continue  # deleted meanwhile: look again
            changed = "updated"
        else:
            created = client.create_automation(automation)
            changed = "created"
            existing = client.read_automations_by_name(automation.name)
            if not existing:  # deleted meanwhile (another setup's clean-up): look again
                continue
            keep = min(existing, key=lambda found: str(found.id))
            if str(keep.id) != str(created):
                changed = "updated"  # another setup's automation stays, ours goes
        for extra in existing:  # a duplicate made by hand or a race: one stays
            if extra.id != keep.id:
                _found(client.delete_automation, extra.id)  # 404: already deleted
        return {"name": automation.name, "id": str(keep.id), "changed": changed}
    raise RuntimeError(f"automation {automation.name!r} kept changing under this setup")


def _found(call: Callable[..., object], *args: Any) -> bool:
    """`call(*args)`; False when the server answered 404 (Prefect's client raises for it, even
    where its own code means to ignore it)."""
    try:
        call(*args)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return False
        raise
    return True


def _notification_block(client: Any, block: str) -> Any:
    """The id of the notification block named `block` (``NAME`` or ``TYPE-SLUG/NAME``)."""
    slug, _, name = block.rpartition("/")
    named = [
        doc
        for doc in client.read_block_documents(limit=200, include_secrets=False)
        if doc.name == name and (not slug or (doc.block_type and doc.block_type.slug == slug))
    ]
    found = [
        doc
        for doc in named
        if doc.block_schema is not None and "notify" in (doc.block_schema.capabilities or [])
    ]
    if not found and named:  # a block of that name that cannot send notifications
        kinds = ", ".join(sorted(f"{d.block_type.slug}/{d.name}" for d in named if d.block_type))
        raise InvalidInput(
            f"--notify {block!r}: {kinds} cannot send notifications (a block type without "
            "the 'notify' capability, such as the plain Webhook block); save a notification "
            "block instead: Custom Webhook (custom-webhook), Slack Webhook, Microsoft Teams "
            "Webhook or Email"
        )
    if not found:
        raise InvalidInput(
            f"--notify {block!r}: no notification block of that name on the Prefect server "
            "(save one first, e.g. a Slack, email or custom-webhook block)"
        )
    if len(found) > 1:
        kinds = ", ".join(sorted(f"{d.block_type.slug}/{d.name}" for d in found if d.block_type))
        raise InvalidInput(f"--notify {block!r}: several blocks have that name ({kinds}): name one")
    return found[0].id


def _human(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
