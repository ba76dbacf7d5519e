"""Approval and assembly from Prefect.

`approval_step` waits for a person inside a deployment's top-level flow run: it suspends the
run (no worker is held) with a typed input form whose description lists the episode's images
and cost. Resuming from the UI starts the run again from the top, where allocation and
generation are idempotent (no paid call), and the suspend returns the submitted input.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow
from prefect.flow_runs import suspend_flow_run
from prefect.input import RunInput
from prefect.logging import get_run_logger

from core.money import format_minor
from core.settings import load_settings
from pipeline.review import approval_digest, assemble, decide, review_set
from storage.registry import engine_for
from storage.review import ReviewStore
from storage.runs import RunStore

DAY_S = 24 * 3600


class ApprovalInput(RunInput):
    decision: Literal["approve", "reject"]
    reviewer: str
    note: str = ""


def approval_form_description(
    episode_id: str, pipeline: str, outputs: list[dict[str, Any]] | None = None
) -> str:
    """The form's Markdown: exactly the images the decision is about (the current plan's)."""
    engine = engine_for(load_settings())
    store = RunStore(engine)
    pk = store.episode_pk(pipeline, episode_id)
    outputs = review_set(engine, pipeline, episode_id) if outputs is None else outputs
    lines = [
        f"## Approve episode {episode_id}",
        "",
        f"{len(outputs)} images, cost so far {format_minor(store.episode_cost(pk))}.",
        "",
        "| image | file | sha256 |",
        "|---|---|---|",
    ]
    lines += [
        f"| {o['video_id']}.p{o['part']} | `{o['output_path']}` | `{o['output_sha256'][:12]}` |"
        for o in outputs
    ]
    return "\n".join(lines)


def approval_step(episode_id: str, pipeline: str, timeout_s: int) -> ApprovalInput:
    """Suspend for a decision (or return the one given on resume) and record it.

    Refused before suspending unless the episode is generated (or already decided, when a
    resumed run comes back here). The decision is bound to the images the form showed: the
    suspend key carries their digest, so if the plan or an image changes while the run waits,
    the resumed run asks again with a new form instead of applying the old answer to images
    nobody saw (and `decide` re-checks the digest when it records).
    """
    _check_waiting(episode_id, pipeline)
    engine = engine_for(load_settings())
    review = ReviewStore(engine)
    pk = RunStore(engine).episode_pk(pipeline, episode_id)
    state = review.state(pk)
    outputs = review_set(engine, pipeline, episode_id) if state == "generated" else []
    shown = {o["idempotency_key"]: o["output_sha256"] for o in outputs}
    if state in ("approved", "assembled"):  # decided before a retry: the same key again
        shown = review.approved_items(pk) or {}
    digest = approval_digest(shown)
    form = ApprovalInput.with_initial_data(
        description=approval_form_description(episode_id, pipeline, outputs),
        decision="approve",
        reviewer="",
    )
    answer: ApprovalInput = suspend_flow_run(
        wait_for_input=form,
        timeout=timeout_s,
        key=f"approval-{episode_id.lower()}-{digest[:16]}",
    )
    record_decision(episode_id, pipeline, answer, expected_digest=digest if outputs else None)
    return answer


def _check_waiting(episode_id: str, pipeline: str) -> None:
    from core.errors import CommandNotAllowed
    from core.ids import EpisodeId
    from storage.episodes import EpisodeRepository

    engine = engine_for(load_settings())
    state = EpisodeRepository(engine).get(pipeline, EpisodeId.parse(episode_id)).state
    if state not in ("generated", "approved", "rejected", "assembled"):
        raise CommandNotAllowed(
            f"episode {episode_id} is {state}: only a generated episode waits for approval"
        )


def record_decision(
    episode_id: str, pipeline: str, answer: ApprovalInput, expected_digest: str | None = None
) -> dict[str, Any]:
    engine = engine_for(load_settings())
    return decide(
        engine,
        pipeline,
        episode_id,
        approve=answer.decision == "approve",
        by=answer.reviewer,
        note=answer.note or None,
        expected_digest=expected_digest,
    )


@flow(name="approve-episode", validate_parameters=True)
def approve_episode(
    episode_id: str, pipeline: str | None = None, timeout_s: int = 7 * DAY_S
) -> dict[str, Any]:
    """Wait for a person's decision on a generated episode (deploy it: it suspends)."""
    settings = load_settings()
    name = pipeline or settings.pipeline
    answer = approval_step(episode_id, name, timeout_s)
    get_run_logger().info("episode %s: %s by %s", episode_id, answer.decision, answer.reviewer)
    return {"episode_id": episode_id, "decision": answer.decision, "by": answer.reviewer}


@flow(name="assemble-episode", validate_parameters=True)
def assemble_episode(episode_id: str, pipeline: str | None = None) -> dict[str, Any]:
    """Assemble an approved episode (refused otherwise); rerunning it changes nothing."""
    settings = load_settings()
    return assemble(engine_for(settings), settings, pipeline or settings.pipeline, episode_id)
