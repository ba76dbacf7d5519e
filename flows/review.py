"""Approval and assembly from Prefect.

`approval_step` waits for a person inside a deployment's top-level flow run: it suspends the
run (no worker is held) with a typed input form that shows the episode's images themselves
(inline thumbnails), their cost, and any reason the previous answer was refused. Resuming
from the UI starts the run again from the top, where allocation and generation are
idempotent (no paid call), and the suspend returns the submitted input.

Bad input never sticks. The form's schema (required decision and reviewer, lengths) is
checked by the Prefect server before the run resumes; what only we can check (control
characters, a rejection without a note, images changed since they were shown) re-suspends the
run under the next pause key with the reason at the top of the form. Each answer has its own
key, so a retried run replays the refused answers and waits at the first unanswered form
instead of failing on the same stored input forever.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import State, StateType
from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.input import RunInput, keyset_from_base_key
from prefect.logging import get_run_logger
from prefect.states import Completed
from pydantic import ConfigDict, Field, ValidationError, create_model

from core.errors import CommandNotAllowed, InvalidInput
from core.ids import EpisodeId
from core.money import format_minor
from core.playlist import item_label
from core.settings import load_settings
from flows.artifacts import md_text, publish_assembly, publish_decision, publish_spend
from flows.params import EpisodeIdParam, PipelineParam, episode_run_name
from pipeline.review import (
    approval_digest,
    assemble,
    decide,
    decision_stands_hint,
    hero_outputs,
    review_set,
)
from pipeline.thumbnails import thumbnail_data_uri
from storage.approvals import ApprovalStore
from storage.episodes import EpisodeRepository
from storage.ledger import LedgerStore
from storage.locks import keyed_transaction
from storage.registry import engine_for

DAY_S = 24 * 3600
MAX_ANSWERS = 50  # refused answers per form before the run gives up (a bot, not a person)
MAX_PREVIEWS = 60  # thumbnails inlined in one form; the rest are listed by name


# JSON Schema rules the Prefect server checks before a run resumes, so a bad answer is
# refused at once, the run still waiting, instead of after the run came back from a worker
# (tens of seconds later) to suspend again. The server words a failure with jsonschema's
# message and has no custom messages: a value matching `pattern` must then equal a `const`
# that says what is wanted, read as "Validation failed for field 'reviewer'. Failure reason:
# 'a name, not only spaces ...' was expected" (a bare `pattern` read "' ' does not match
# '\\S'"). Prefect's UI leaves `if`/`then` out of the form it renders; `decide` checks the
# same rules again after the resume.
_CONTROLS = r"\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069"
REVIEWER_WANTED = "a name, not only spaces, without control characters"
NOTE_WANTED = "a note saying why (a rejection needs one)"
NOTE_CONTROL_WANTED = "a note without control characters"


def refuse_matching(pattern: str, wanted: str) -> dict[str, Any]:
    """A schema fragment: a string matching `pattern` is refused, the message naming
    `wanted`."""
    return {"if": {"type": "string", "pattern": pattern}, "then": {"const": wanted}}


def _rejection_needs_a_note(schema: dict[str, Any]) -> None:
    schema["if"] = {"properties": {"decision": {"const": "reject"}}, "required": ["decision"]}
    schema["then"] = {
        "properties": {"note": refuse_matching(r"^\s*$", NOTE_WANTED)},
        "required": ["note"],
    }


class ApprovalInput(RunInput):
    """The approval form. The Prefect server validates an answer against this schema before
    the run resumes: decision and reviewer are required, the reviewer is a name (not blank,
    no control characters), a rejection has a note."""

    model_config = ConfigDict(json_schema_extra=_rejection_needs_a_note)

    decision: Literal["approve", "reject"] = Field(
        description="approve: exactly the images above ship. reject: the episode goes back "
        "for re-planning (a note is required)."
    )
    reviewer: str = Field(
        min_length=1,
        max_length=100,
        description="Your name, recorded with the decision.",
        json_schema_extra=refuse_matching(rf"^\s*$|[{_CONTROLS}\t\n\r]", REVIEWER_WANTED),
    )
    note: str = Field(
        default="",
        max_length=2000,
        description="Why (required when rejecting).",
        json_schema_extra=refuse_matching(f"[{_CONTROLS}]", NOTE_CONTROL_WANTED),
    )


def approval_input_for(outputs: list[dict[str, Any]]) -> type[ApprovalInput]:
    """The form for these images: `ApprovalInput`, plus, for each hero video (in plan order),
    a required field `pick_N` (N = 1, 2, ... over the hero videos) holding the candidate
    that ships, an integer within the video's candidates. The server checks presence and
    range before the run resumes; `picks_of` maps the answer back to video ids."""
    heroes = hero_outputs(outputs)
    if not heroes:
        return ApprovalInput
    fields: dict[str, Any] = {
        f"pick_{n}": (
            int,
            Field(
                ge=1,
                le=len(candidates),
                title=f"{video}: the candidate that ships",
                description=f"1 to {len(candidates)}: the candidate of {video} shown above "
                "that ships if you approve (ignored when rejecting).",
            ),
        )
        for n, (video, candidates) in enumerate(heroes.items(), start=1)
    }
    model: type[ApprovalInput] = create_model("HeroApprovalInput", __base__=ApprovalInput, **fields)
    return model


def form_digest(shown: dict[str, str], outputs: list[dict[str, Any]]) -> str:
    """What a form is about: `approval_digest` of its images, and, with hero videos, which
    video each pick field names (sha256 hex). Equal digests: an answer means the same."""
    digest = approval_digest(shown)
    heroes = list(hero_outputs(outputs))
    if not heroes:
        return digest  # the key of forms without picks is unchanged
    return hashlib.sha256(f"{digest}|picks:{','.join(heroes)}".encode()).hexdigest()


def picks_of(answer: ApprovalInput, outputs: list[dict[str, Any]]) -> dict[str, int] | None:
    """The answer's picks as video id -> candidate (None: the form had no hero videos, or
    the answer is a rejection)."""
    heroes = hero_outputs(outputs)
    if not heroes or answer.decision != "approve":
        return None
    values = answer.model_dump()
    return {
        video: int(values[f"pick_{n}"])
        for n, video in enumerate(heroes, start=1)
        if isinstance(values.get(f"pick_{n}"), int)
    }


def approval_tag(engine: Any, pipeline: str, episode_id: str) -> str:
    """Tag of the flow run that waits for an episode's decision (one per episode). It names
    the episode's row in this database (key and creation time), so two databases that share
    a Prefect server (staging and production) never see each other's waiting runs."""
    episode, pk = EpisodeRepository(engine).locate(pipeline, EpisodeId.parse(episode_id))
    row = hashlib.sha256(f"{pk}@{episode.created_at.isoformat()}".encode()).hexdigest()[:12]
    return f"episodic-approval:{pipeline}/{episode_id}/{row}"


def approval_form_description(
    episode_id: str,
    pipeline: str,
    outputs: list[dict[str, Any]] | None = None,
    refused: str | None = None,
) -> str:
    """The form's Markdown: exactly the images the decision is about (the current plan's),
    as inline previews with their cost, and the reason the last answer was refused."""
    engine = engine_for(load_settings())
    episodes = EpisodeRepository(engine)
    ledger = LedgerStore(engine)
    pk = episodes.episode_pk(pipeline, episode_id)
    outputs = review_set(engine, pipeline, episode_id) if outputs is None else outputs
    paid, cost_minor, currency = ledger.episode_spend(pk)
    lines = []
    if refused:
        lines += [f"> **Your last answer was not recorded:** {md_text(refused)}", ""]
    earlier = ApprovalStore(engine).latest_decision(pk)
    if earlier is not None and earlier.decision == "rejected":  # re-planned or reopened since
        lines += [
            f"> **Rejected before:** {md_text(earlier.describe())}. The episode was "
            "re-planned or reopened since; below are the images of its current plan.",
            "",
        ]
    heroes = hero_outputs(outputs)
    parts = [o for o in outputs if o.get("candidate") is None]
    lines += [
        f"## Approve episode {episode_id}",
        "",
        f"{len(outputs)} images; the episode cost {format_minor(cost_minor, currency)} "
        f"in {paid} paid calls.",
    ]
    if heroes:
        lines += [
            "",
            f"{len(heroes)} hero video{'s' if len(heroes) > 1 else ''}: "
            f"{'each' if len(heroes) > 1 else 'it'} ships the one candidate you pick below "
            "(the fields *the candidate that ships*).",
        ]
    shown = 0

    def table(rows: list[dict[str, Any]], first: str) -> None:
        nonlocal shown
        lines.extend(["", f"| {first} | preview | cost | sha256 |", "|---|---|---|---|"])
        for o in rows:
            label = item_label(o["video_id"], o["part"], o.get("candidate"))
            uri = thumbnail_data_uri(_path(o)) if shown < MAX_PREVIEWS else None
            shown += 1
            preview = f"![{label}]({uri})" if uri else f"`{_path(o).name}`"
            cost = format_minor(int(o["amount_minor"]), o["currency"])
            name = label if o.get("candidate") is None else f"candidate {o['candidate']}"
            lines.append(f"| {name} | {preview} | {cost} | `{o['output_sha256'][:12]}` |")

    if parts:
        table(parts, "image")
    for video, candidates in heroes.items():
        lines += ["", f"### {video}: pick one of {len(candidates)} candidates"]
        table(candidates, "candidate")
    return "\n".join(lines)


def _path(output: dict[str, Any]) -> Any:
    from pathlib import Path

    return Path(output["output_path"])


def approval_step(
    episode_id: str, pipeline: str, timeout_s: int
) -> tuple[ApprovalInput | None, dict[str, Any] | None]:
    """Suspend for a decision (or return the one given on resume) and record it.

    Returns ``(answer, recorded)``; ``(None, None)`` when another flow run of this episode is
    already waiting for the decision (a duplicate dispatch, two workers on one slot): this
    run joins it instead of showing a second form. Refused before suspending unless the
    episode is generated or decided.

    A decision stands (DESIGN 7): an episode already approved, assembled or rejected (a
    retry of the run that decided it, a duplicate dispatch, a decision on the command line)
    shows no form; the run follows the decision on record, its log saying who decided, when
    and why. ``recorded`` then has ``followed`` (that decision, described) and, when this
    run held an answer that differs from it (the loser of two decisions), ``overruled``: why
    that answer was not recorded.

    The decision is bound to the images the form showed: the pause key carries their digest,
    so if the plan or an image changes while the run waits, the resumed run asks again with a
    new form instead of applying the old answer to images nobody saw.
    """
    engine = engine_for(load_settings())
    state = _check_waiting(engine, episode_id, pipeline)
    review = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    pk = episodes.episode_pk(pipeline, episode_id)
    tag = approval_tag(engine, pipeline, episode_id)
    fired = _fired_pause_keys()
    if state != "generated":
        overruled = (
            _unread_answer_refusal(episode_id, pipeline, fired) if _waited_here(tag) else None
        )
        return _follow_record(review, pk, episode_id, overruled)
    outputs = review_set(engine, pipeline, episode_id)
    shown = {o["idempotency_key"]: o["output_sha256"] for o in outputs}
    if not _claim_approval_wait(engine, pipeline, episode_id):
        return None, None
    # The form's key carries the images' digest and which hero video each pick field names
    # (fields are numbered in plan order): a re-plan that reorders the hero videos keeps
    # every image, but an answer given to the old form would ship one video's pick for
    # another, so it gets a new form (found by the fresh tester of issue 14).
    digest = form_digest(shown, outputs)
    refused = _outdated_answer(episode_id, digest, fired)
    form_type = approval_input_for(outputs)
    for attempt in range(MAX_ANSWERS):
        form = form_type.with_initial_data(
            description=approval_form_description(episode_id, pipeline, outputs, refused)
        )
        answer = _ask(
            form, f"approval-{episode_id.lower()}-{digest[:16]}-{attempt}", timeout_s, fired
        )
        if answer is None:  # this form was shown but never answered (it timed out, or the
            continue  # run was retried while waiting): ask again under the next key
        try:
            recorded = record_decision(
                episode_id,
                pipeline,
                answer,
                expected_digest=approval_digest(shown),
                picks=picks_of(answer, outputs),
            )
        except (InvalidInput, CommandNotAllowed) as exc:
            if isinstance(exc, CommandNotAllowed) and "changed since" not in str(exc):
                if episodes.state(pk) in DECIDED:  # decided elsewhere meanwhile: follow that
                    return _follow_record(review, pk, episode_id, str(exc))
                raise
            refused = str(exc)
            get_run_logger().warning("answer %d refused: %s", attempt + 1, refused)
            continue
        return answer, recorded
    raise InvalidInput(f"episode {episode_id}: {MAX_ANSWERS} answers refused; last: {refused}")


DECIDED = ("approved", "rejected", "assembled")
SUSPENDED_KEYSET = "suspended-"  # Prefect's keyset prefix of a `suspend_flow_run` input


def _fired_pause_keys() -> frozenset[str]:
    """The pause keys that already suspended this attempt of the flow run (Prefect resets
    them when the run is retried): a suspend under one of these would not suspend again but
    return the answer it was resumed with."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return frozenset()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(context.flow_run.id)
    return frozenset(run.empirical_policy.pause_keys or ())


def _ask(
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


def _unread_answer_refusal(episode_id: str, pipeline: str, fired: frozenset[str]) -> str | None:
    """This run was resumed with an answer, but the episode was decided before the run
    came back to record it (another decision won): why that answer is not recorded (None:
    it is the decision on record, or there is no such answer). `decide` compares it."""
    prefix = f"approval-{episode_id.lower()}-"
    keys = sorted(
        (k for k in fired if k.startswith(prefix) and k.rsplit("-", 1)[-1].isdigit()),
        key=lambda k: int(k.rsplit("-", 1)[-1]),
    )
    if not keys:
        return None
    engine = engine_for(load_settings())
    try:
        outputs = review_set(engine, pipeline, episode_id)
    except CommandNotAllowed:  # no plan, images not complete or not as paid for
        outputs = []
    answer = _ask(approval_input_for(outputs), keys[-1], 60, fired)
    if answer is None:
        return None
    try:
        decide(
            engine,
            pipeline,
            episode_id,
            approve=answer.decision == "approve",
            by=answer.reviewer,
            note=answer.note or None,
            labels=("reviewer", "note"),
            picks=picks_of(answer, outputs),
            picks_label="the candidate that ships",
        )
    except (InvalidInput, CommandNotAllowed) as exc:
        return str(exc)
    return None  # the same decision: nothing to say


def _waited_here(tag: str) -> bool:
    """This flow run is the one that showed the episode's form (it carries the tag)."""
    context = FlowRunContext.get()
    return bool(context and context.flow_run and tag in (context.flow_run.tags or []))


def _follow_record(
    review: ApprovalStore, pk: int, episode_id: str, overruled: str | None = None
) -> tuple[ApprovalInput, dict[str, Any]]:
    """The decision on record, as the form's answer (who decided, when, why), logged with
    what to do about it; `overruled`: why this run's own answer was not recorded."""
    decided = review.latest_decision(pk)
    state = EpisodeRepository(review.engine).state(pk)
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
        decision="reject" if state == "rejected" else "approve",
        reviewer=decided.by if decided else "?",
        note=(decided.note or "") if decided else "",
    )
    return answer, {"followed": described, "overruled": overruled}


def _outdated_answer(episode_id: str, digest: str, fired: frozenset[str]) -> str | None:
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


def _check_waiting(engine: Any, episode_id: str, pipeline: str) -> str:
    state = EpisodeRepository(engine).get(pipeline, EpisodeId.parse(episode_id)).state
    if state not in ("generated", "approved", "rejected", "assembled"):
        raise CommandNotAllowed(
            f"episode {episode_id} is {state}: only a generated episode waits for approval"
        )
    return str(state)


def _claim_approval_wait(engine: Any, pipeline: str, episode_id: str) -> bool:
    """Make this flow run the one that waits for the episode's decision, unless another
    paused run already is (then False). Serialized per episode through the database, so two
    runs reaching approval together show one form between them."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return True
    me = context.flow_run
    tag = approval_tag(engine, pipeline, episode_id)
    if tag in (me.tags or []):  # resumed: this run is the one that waits
        return True
    with (
        keyed_transaction(engine, f"approval-wait:{pipeline}:{episode_id}"),
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
                episode_id,
                others[0].name,
            )
            return False
        client.update_flow_run(me.id, tags=[*(me.tags or []), tag])
    return True


def record_decision(
    episode_id: str,
    pipeline: str,
    answer: ApprovalInput,
    expected_digest: str | None = None,
    picks: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Record the form's answer (`pipeline.review.decide` with the form's field names) and
    publish the decision artifact. `picks`: hero video id -> candidate that ships.
    Raises `InvalidInput` / `CommandNotAllowed` unrecorded."""
    engine = engine_for(load_settings())
    recorded = decide(
        engine,
        pipeline,
        episode_id,
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
    publish_decision(engine, pipeline, episode_id, decision)
    publish_spend(engine, pipeline, episode_id)  # the cost table shows the decided state
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
    timeout_s: Annotated[int, Field(ge=60, le=90 * DAY_S, strict=True)] = 7 * DAY_S,
) -> Any:
    """Wait for a person's decision on a generated episode (deploy it: it suspends).

    Args:
        episode_id: the episode to decide, e.g. 2026-W32-1 (it must be generated).
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        timeout_s: seconds the form waits before the run fails (60 s to 90 days).
    """
    name = pipeline or load_settings().pipeline
    answer, recorded = approval_step(episode_id, name, timeout_s)
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
    assembled = assemble(engine, settings, pipeline, episode_id)
    publish_assembly(engine, pipeline, episode_id, assembled)
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
