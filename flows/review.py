"""Approval and assembly from Prefect: the `approve-episode` and `assemble-episode` flows.

`approval_step` waits for a person inside a deployment's top-level flow run: it suspends the
run (no worker is held) with the typed form of `episodic.flows.approval.form`, which shows the
episode's images themselves (inline thumbnails), their cost, and any reason the previous
answer was refused; `episodic.flows.approval.wait` keeps one waiting run per episode and reads the
answers a run was resumed with. A refused answer re-suspends the run under the next pause
key with the reason at the top of the form.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.client.schemas.objects import State
from prefect.logging import get_run_logger
from prefect.states import Completed

from episodic.core.errors import CommandNotAllowed, ImagesChangedSinceShown, InvalidInput
from episodic.core.settings import load_settings
from episodic.core.states import DECIDED_STATES, EpisodeState
from episodic.flows.approval.form import (
    ApprovalInput,
    RefusalInput,
    approval_form_description,
    approval_input_for,
    form_digest,
    picks_of,
)
from episodic.flows.approval.wait import (
    Refused,
    ask,
    claim_approval_wait,
    fired_pause_keys,
    outdated_answer,
    refusal_form_description,
    unread_answer_refusal,
    waited_here,
)
from episodic.flows.artifacts import publish_assembly, publish_decision, publish_spend
from episodic.flows.params import (
    APPROVAL_TIMEOUT_DEFAULT_S,
    ApprovalTimeoutParam,
    EpisodeIdParam,
    PipelineParam,
    episode_run_name,
)
from episodic.pipeline.approval import (
    ApprovalContext,
    approval_context,
    approval_digest,
    decision_stands_hint,
    waiting_state,
)
from episodic.pipeline.assembly import assemble
from episodic.pipeline.media_view import open_store, preview_bytes
from episodic.storage.registry import engine_for

MAX_ANSWERS = 50  # refused answers per form before the run gives up (a bot, not a person)


def approval_step(
    episode_id: str, pipeline: str, timeout_s: int
) -> tuple[ApprovalInput | None, dict[str, Any] | None]:
    """Suspend for a decision (or return the one given on resume) and record it.

    Returns ``(answer, recorded)``; ``(None, None)`` when another flow run of this episode is
    already waiting for the decision (a duplicate dispatch, two workers on one slot): this
    run joins it instead of showing a second form. Refused before suspending unless the
    episode is generated or decided.

    A decision stands: an episode already approved, assembled or rejected (a
    retry of the run that decided it, a duplicate dispatch, a decision on the command line)
    shows no form; the run follows the decision on record, its log saying who decided, when
    and why. ``recorded`` then has ``followed`` (that decision, described). A run resumed
    with that decision (`episodic approve` resumes the waiting run with it) goes on; a run
    resumed with an answer that differs from it (the loser of two decisions) suspends again
    with a form saying whose decision stands and that the answer was not recorded.

    The decision is bound to the images the form showed: the pause key carries their digest,
    so if the plan or an image changes while the run waits, the resumed run asks again with a
    new form instead of applying the old answer to images nobody saw.
    """
    engine = engine_for(load_settings())
    state = waiting_state(engine, pipeline, episode_id)
    approval = approval_context(engine, pipeline, episode_id)
    tag = approval.wait_tag()
    fired = fired_pause_keys()
    if state != EpisodeState.GENERATED:
        lost = unread_answer_refusal(approval, fired) if waited_here(tag) else None
        if lost is not None:  # decided otherwise before this answer: say so in the form
            return _refuse_in_form(approval, lost, timeout_s, episode_id, pipeline)
        return _follow_record(approval)
    outputs = approval.review_set()
    shown = {o.idempotency_key: o.sha256 for o in outputs}
    if not claim_approval_wait(approval):
        return None, None
    # The form's key carries the images' digest and which hero video each pick field names
    # (fields are numbered in plan order): a re-plan that reorders the hero videos keeps
    # every image, but an answer given to the old form would ship one video's pick for
    # another, so it gets a new form.
    digest = form_digest(shown, outputs)
    refused = outdated_answer(episode_id, digest, fired)
    form_type = approval_input_for(outputs)
    for attempt in range(MAX_ANSWERS):
        form = form_type.with_initial_data(
            description=approval_form_description(approval, outputs, refused)
        )
        answer = ask(
            form, f"approval-{episode_id.lower()}-{digest[:16]}-{attempt}", timeout_s, fired
        )
        if answer is None:  # this form was shown but never answered (it timed out, or the
            continue  # run was retried while waiting): ask again under the next key
        try:
            recorded = record_decision(
                approval,
                answer,
                expected_digest=approval_digest(shown),
                picks=picks_of(answer, outputs),
            )
        except (InvalidInput, CommandNotAllowed) as exc:
            if isinstance(exc, CommandNotAllowed) and not isinstance(exc, ImagesChangedSinceShown):
                if approval.state() in DECIDED_STATES:  # decided elsewhere meanwhile: say so
                    key = f"approval-{episode_id.lower()}-{digest[:16]}-{attempt}"
                    lost = Refused(str(exc), answer, key)
                    return _refuse_in_form(approval, lost, timeout_s, episode_id, pipeline)
                raise
            refused = str(exc)
            get_run_logger().warning("answer %d refused: %s", attempt + 1, refused)
            continue
        return answer, recorded
    raise InvalidInput(f"episode {episode_id}: {MAX_ANSWERS} answers refused; last: {refused}")


def _refuse_in_form(
    approval: ApprovalContext, refused: Refused, timeout_s: int, episode_id: str, pipeline: str
) -> tuple[ApprovalInput | None, dict[str, Any] | None]:
    """An answer that lost to the decision on record is refused visibly: the run suspends
    again, under the next pause key, with a form saying whose decision stands and that
    this answer was not recorded (the run does not end green as if nothing happened). The
    decision on record, answered there (or `episodic approve` again), lets the run go on."""
    get_run_logger().warning(
        "episode %s: the answer (%s by %s) was refused, the form waits again: %s",
        episode_id,
        refused.answer.decision,
        refused.answer.reviewer,
        refused.reason,
    )
    form = RefusalInput.with_initial_data(description=refusal_form_description(approval, refused))
    # suspends: the run exits here and, once answered, starts again from the top
    ask(form, refused.next_key(), timeout_s, frozenset())
    return approval_step(episode_id, pipeline, timeout_s)


def _follow_record(
    approval: ApprovalContext, overruled: str | None = None
) -> tuple[ApprovalInput, dict[str, Any]]:
    """The decision on record, as the form's answer (who decided, when, why), logged with
    what to do about it; `overruled`: why this run's own answer was not recorded."""
    episode_id = approval.episode_id
    decided = approval.latest_decision()
    state = approval.state()
    described = decided.describe() if decided else state
    logger = get_run_logger()
    if overruled:
        logger.warning(
            "episode %s: the answer this run was resumed with was not recorded: %s",
            episode_id,
            overruled,
        )
    logger.info(
        "episode %s was %s; the decision stands: %s",
        episode_id,
        described,
        decision_stands_hint(episode_id, state),
    )
    answer = ApprovalInput.model_construct(
        decision="reject" if state == EpisodeState.REJECTED else "approve",
        reviewer=decided.by if decided else "?",
        note=(decided.note or "") if decided else "",
    )
    return answer, {"followed": described, "overruled": overruled}


def record_decision(
    approval: ApprovalContext,
    answer: ApprovalInput,
    expected_digest: str | None = None,
    picks: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Record the form's answer (`pipeline.approval.decide` with the form's field names) and
    publish the decision artifact. `picks`: hero video id -> candidate that ships.
    Raises `InvalidInput` / `CommandNotAllowed` unrecorded."""
    recorded = approval.decide(
        approve=answer.decision == "approve",
        by=answer.reviewer,
        note=answer.note or None,
        expected_digest=expected_digest,
        labels=("reviewer", "note"),
        picks=picks,
        picks_label="the candidate that ships",
    )
    decision: dict[str, Any] = {
        "decision": answer.decision,
        "by": answer.reviewer,
        "note": answer.note,
    }
    if recorded.get("picks"):
        decision["picks"] = recorded["picks"]
    publish_decision(approval.engine, approval.pipeline, approval.episode_id, decision)
    # the cost table shows the decided state
    publish_spend(approval.engine, approval.pipeline, approval.episode_id)
    return recorded


def decision_state(
    episode_id: str,
    answer: ApprovalInput | None,
    result: Any,
    recorded: dict[str, Any] | None = None,
) -> State[Any] | Any:
    """The run's final state: a rejection ends as a `Completed` state named "Rejected" (a
    retried run of a rejected episode too: the decision stands) and a joined duplicate as one
    named "Joined", so the UI tells them from an approval. `recorded`: `approval_step`'s
    account (a followed decision is described with its time; an overruled answer is named)."""
    if answer is None:
        return Completed(
            name="Joined", message=f"episode {episode_id} already waits for a decision"
        )
    followed = (recorded or {}).get("followed")
    overruled = (recorded or {}).get("overruled")
    if answer.decision == "reject":
        message = (
            f"episode {episode_id} was {followed}; the rejection stands"
            if followed
            else f"episode {episode_id} rejected by {answer.reviewer}: {answer.note}"
        )
        if overruled:
            message += f"; this run's answer was not recorded: {overruled}"
        return Completed(name="Rejected", message=message)
    return result


@flow(
    name="approve-episode",
    validate_parameters=True,
    flow_run_name=episode_run_name("approve"),
)
def approve_episode(
    episode_id: EpisodeIdParam,
    pipeline: PipelineParam = None,
    approval_timeout_s: ApprovalTimeoutParam = APPROVAL_TIMEOUT_DEFAULT_S,
    timeout_s: ApprovalTimeoutParam | None = None,
) -> Any:
    """Wait for a person's decision on a generated episode (deploy it: it suspends).

    Args:
        episode_id: the episode to decide, e.g. 2026-W32-1 (it must be generated).
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        approval_timeout_s: seconds the form waits before the run fails (60 s to 90 days).
        timeout_s: read in place of approval_timeout_s when set, for deployments whose
            parameters name it so.
    """
    name = pipeline or load_settings().pipeline
    waits = approval_timeout_s if timeout_s is None else timeout_s
    answer, recorded = approval_step(episode_id, name, waits)
    if answer is not None:
        get_run_logger().info("episode %s: %s by %s", episode_id, answer.decision, answer.reviewer)
    result = {
        "episode_id": episode_id,
        "decision": None if answer is None else answer.decision,
        "by": None if answer is None else answer.reviewer,
        "recorded": recorded,
    }
    return decision_state(episode_id, answer, result, recorded)


def assemble_step(episode_id: str, pipeline: str) -> dict[str, Any]:
    """Assemble (idempotent) and publish the assembly and cost artifacts."""
    settings = load_settings()
    engine = engine_for(settings)
    store = open_store(settings, engine, adopt=True)
    assembled = assemble(engine, settings, pipeline, episode_id, store=store)
    cover = preview_bytes(store, str(assembled["cover"]))
    publish_assembly(engine, pipeline, episode_id, assembled, cover)
    publish_spend(engine, pipeline, episode_id)
    return assembled


@flow(
    name="assemble-episode",
    validate_parameters=True,
    flow_run_name=episode_run_name("assemble"),
)
def assemble_episode(episode_id: EpisodeIdParam, pipeline: PipelineParam = None) -> dict[str, Any]:
    """Assemble an approved episode (refused otherwise); rerunning it changes nothing.

    Args:
        episode_id: the approved episode, e.g. 2026-W32-1.
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
    """
    return assemble_step(episode_id, pipeline or load_settings().pipeline)
