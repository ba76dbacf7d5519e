"""Resume the flow run that waits for an episode's decision, once the decision is on record.

A decision taken outside the form (`episodic approve`, `--reject`) is recorded first (the
database is the truth); then the Prefect flow run suspended at the episode's form (it carries
`ApprovalContext.wait_tag`) is resumed with that recorded decision as the form's answer. The
resumed run reads the answer, finds it is the decision on record (`decide` records nothing
new) and goes on: an approval is assembled, a rejection ends "Rejected". Without a Prefect
API, or without a waiting run, nothing is resumed and the caller says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.settings import get_current_settings

from episodic.core.states import EpisodeState
from episodic.flows.prefect_api import TOTAL_DEADLINE_S, PrefectApiSilent, api_label, bounded
from episodic.pipeline.approval import NO_PREFECT_API, ApprovalContext

_PICK = re.compile(r"pick_\d+", re.ASCII)
_TITLE = " the candidate that ships"  # `approval_input_for`: "VIDEO: the candidate that ships"


@dataclass(frozen=True, slots=True)
class Resumed:
    """What became of the waiting run: `flow_run` names the resumed run (None: none was)."""

    flow_run: str | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"flow_run": self.flow_run, "message": self.message}


def resume_waiting_run(approval: ApprovalContext) -> Resumed:
    """Resume the flow run waiting at `approval`'s form with the decision on record.
    Never raises for Prefect's sake: the decision is recorded whatever happens here."""
    decided = approval.latest_decision()
    if decided is None:
        return Resumed(None, "no decision on record: no waiting flow run was resumed")
    url = get_current_settings().api.url
    if not url:
        return Resumed(None, NO_PREFECT_API)
    try:
        return bounded(lambda: _resume(approval, decided))
    except Exception as exc:  # an unreachable, silent or refusing server: the decision stands
        reason = (
            f"within {TOTAL_DEADLINE_S:g} s"
            if isinstance(exc, PrefectApiSilent)
            else f"({type(exc).__name__})"
        )
        return Resumed(
            None,
            f"the Prefect API at {api_label()} did not answer {reason}: the waiting flow run "
            "was not resumed; run approve again, or answer its form in the UI",
        )


def _resume(approval: ApprovalContext, decided: Any) -> Resumed:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[approval.wait_tag()]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
            ),
            limit=5,
        )
        if not runs:
            return Resumed(None, "no flow run waits for this decision: none was resumed")
        resumed: list[str] = []
        refused: list[str] = []
        for run in runs:
            answer = _answer(client, run, decided)
            result = client.resume_flow_run(run.id, run_input=answer)
            if result.status == SetStateStatus.ACCEPT:
                resumed.append(run.name)
            else:
                why = result.details.reason if hasattr(result.details, "reason") else None
                refused.append(f"{run.name} ({why or result.status.value})")
    if not resumed:
        return Resumed(None, f"the waiting flow run refused to resume: {', '.join(refused)}")
    return Resumed(
        resumed[0],
        f"resumed the waiting flow run {', '.join(resumed)} with this decision"
        + (f" (refused: {', '.join(refused)})" if refused else ""),
    )


def _answer(client: Any, run: FlowRun, decided: Any) -> dict[str, Any]:
    """The form's answer saying `decided`: its fields as the waiting form's schema names them
    (a hero form's `pick_N` fields are required even for a rejection, which ignores them)."""
    answer: dict[str, Any] = {
        "decision": "reject" if decided.decision == EpisodeState.REJECTED else "approve",
        "reviewer": decided.by,
        "note": decided.note or "",
    }
    keyset = run.state.state_details.run_input_keyset if run.state else None
    if not keyset:
        return answer
    schema = json.loads(client.read_flow_run_input(run.id, keyset["schema"]))
    for name, field in (schema.get("properties") or {}).items():
        if _PICK.fullmatch(name):
            video = str(field.get("title", "")).removesuffix(_TITLE).removesuffix(":")
            answer[name] = (decided.picks or {}).get(video, 1)
    return answer
