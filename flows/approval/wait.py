"""One waiting flow run per episode, and the answers it was resumed with.

A run waits for a decision by suspending with the approval form (no worker is held);
resuming it from the UI starts it again from the top, where allocation and generation are
idempotent (no paid call), and the suspend returns the submitted input. Each answer has its
own pause key (``approval-E-DIGEST-N``): a refused answer re-suspends the run under the next
key, so a retried run replays the refused answers and waits at the first unanswered form
instead of failing on the same stored input forever. Which run waits is decided once per
episode, serialized through the database (`ApprovalContext.one_waiter`), so two runs reaching
approval together show one form between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.input import keyset_from_base_key
from prefect.logging import get_run_logger
from pydantic import ValidationError

from episodic.core.errors import CommandNotAllowed, InvalidInput
from episodic.core.states import EpisodeState
from episodic.flows.approval.form import ApprovalInput, approval_input_for, picks_of
from episodic.flows.artifacts import md_text
from episodic.pipeline.approval import ApprovalContext

SUSPENDED_KEYSET = "suspended-"  # Prefect's keyset prefix of a `suspend_flow_run` input


def fired_pause_keys() -> frozenset[str]:
    """The pause keys that already suspended this attempt of the flow run (Prefect resets
    them when the run is retried): a suspend under one of these would not suspend again but
    return the answer it was resumed with."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return frozenset()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(context.flow_run.id)
    return frozenset(run.empirical_policy.pause_keys or ())


def ask(
    form: type[ApprovalInput], key: str, timeout_s: int, fired: frozenset[str]
) -> ApprovalInput | None:
    """The answer to the form under `key`: the one this run was resumed with if that pause
    already fired (read without calling `suspend_flow_run`, which would log "Suspending flow
    run" on every resume although nothing suspends), else suspend for it (the run exits
    here). None: the form was shown but never answered."""
    try:
        if key in fired:
            loaded = form.load(keyset_from_base_key(f"{SUSPENDED_KEYSET}{key}"))
            assert isinstance(loaded, ApprovalInput)  # a sync call: not a coroutine
            return loaded
        answer: ApprovalInput = suspend_flow_run(wait_for_input=form, timeout=timeout_s, key=key)
        return answer
    except ValidationError:
        return None


@dataclass(frozen=True, slots=True)
class Refused:
    """An answer the form was resumed with that the decision on record refused: `reason`
    (who decided what, when), the `answer` itself and the pause `key` it answered."""

    reason: str
    answer: ApprovalInput
    key: str

    def next_key(self) -> str:
        """The pause key of the form that shows this refusal (the next answer's)."""
        base, n = self.key.rsplit("-", 1)
        return f"{base}-{int(n) + 1}"


def unread_answer_refusal(approval: ApprovalContext, fired: frozenset[str]) -> Refused | None:
    """This run was resumed with an answer, but the episode was decided before the run
    came back to record it (another decision won, e.g. on the command line): that answer,
    refused (None: it is the decision on record, or there is no such answer). `decide`
    compares it: the same decision records nothing new."""
    prefix = f"approval-{approval.episode_id.lower()}-"
    keys = sorted(
        (
            k
            for k in fired
            if k.startswith(prefix)
            and k.rsplit("-", 1)[-1].isascii()
            and k.rsplit("-", 1)[-1].isdigit()
        ),
        key=lambda k: int(k.rsplit("-", 1)[-1]),
    )
    if not keys:
        return None
    try:
        outputs = approval.review_set()
    except CommandNotAllowed:  # no plan, images not complete or not as paid for
        outputs = []
    # the form with the episode's pick fields, else the refusal form (`ApprovalInput`)
    answer = ask(approval_input_for(outputs), keys[-1], 60, fired) or ask(
        ApprovalInput, keys[-1], 60, fired
    )
    if answer is None:
        return None
    try:
        approval.decide(
            approve=answer.decision == "approve",
            by=answer.reviewer,
            note=answer.note or None,
            labels=("reviewer", "note"),
            picks=picks_of(answer, outputs),
            picks_label="the candidate that ships",
        )
    except (InvalidInput, CommandNotAllowed) as exc:
        return Refused(str(exc), answer, keys[-1])
    return None  # the same decision: nothing to say


def refusal_form_description(approval: ApprovalContext, refused: Refused) -> str:
    """The Markdown of the form a run re-suspends with when its answer lost to the decision
    on record: once, that the answer was not recorded and whose decision stands; then what
    to do. The refusal's own words are added only when no decision is on record to name."""
    decided = approval.latest_decision()
    mine = refused.answer
    on_record = (
        "reject" if decided is not None and decided.decision == EpisodeState.REJECTED else "approve"
    )
    if decided is not None:
        why = (
            f"episode {approval.episode_id} was {md_text(decided.describe())} (on the command "
            "line or in another form) before your answer arrived."
        )
    else:
        why = md_text(refused.reason)
    return "\n".join(
        [
            f"> **Your answer ({md_text(mine.decision)} by {md_text(mine.reviewer)}) was not "
            f"recorded:** {why}",
            "",
            f"## Episode {approval.episode_id}: {md_text(str(approval.state()))}",
            "",
            f"Answer **{on_record}** (it records nothing new) to let this run go on"
            f"{' and assemble the episode' if on_record == 'approve' else ''}; to change the "
            f"decision, reopen the episode (`episodic reopen {approval.episode_id} --by NAME "
            "--reason TEXT`) and decide it again.",
        ]
    )


def waited_here(tag: str) -> bool:
    """This flow run is the one that showed the episode's form (it carries the tag)."""
    context = FlowRunContext.get()
    return bool(context and context.flow_run and tag in (context.flow_run.tags or []))


def outdated_answer(episode_id: str, digest: str, fired: frozenset[str]) -> str | None:
    """The reason to show when this run was resumed with an answer to a form for other
    images (the plan or an image changed while the form waited): that answer is not applied.
    Only this attempt's answers count (`fired`): an answer from before a UI Retry was
    applied or refused in its own attempt."""
    prefix = f"approval-{episode_id.lower()}-"
    stale = [k for k in fired if k.startswith(prefix) and f"-{digest[:16]}-" not in k]
    if not stale:
        return None
    return (
        "an answer was given to a form whose images have changed since (the episode was "
        "re-planned or regenerated while the form waited); it was not applied: review the "
        "images below"
    )


def claim_approval_wait(approval: ApprovalContext) -> bool:
    """Make this flow run the one that waits for the episode's decision, unless another
    paused run already is (then False). Serialized per episode through the database, so two
    runs reaching approval together show one form between them."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return True
    me = context.flow_run
    tag = approval.wait_tag()
    if tag in (me.tags or []):  # resumed: this run is the one that waits
        return True
    with (
        approval.one_waiter(),
        get_client(sync_client=True) as client,
    ):
        waiting = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.PAUSED, StateType.RUNNING])
                ),
            ),
            limit=5,
        )
        others = [run for run in waiting if run.id != me.id]
        if others:
            get_run_logger().info(
                "episode %s already waits for a decision in flow run %s: joined it",
                approval.episode_id,
                others[0].name,
            )
            return False
        client.update_flow_run(me.id, tags=[*(me.tags or []), tag])
    return True
