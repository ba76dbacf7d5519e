"""The approval form: the typed input a waiting flow run suspends with, and its Markdown.

Bad input never sticks. The form's schema (required decision and reviewer, lengths) is
checked by the Prefect server before the run resumes; what only we can check (control
characters, a rejection without a note, images changed since they were shown) is checked
by `decide` after the resume, and the reason is shown at the top of the next form.
"""

from __future__ import annotations

import hashlib
import html
from typing import Any, Literal

from prefect.input import RunInput
from pydantic import ConfigDict, Field, create_model

from episodic.core.money import format_money, format_totals
from episodic.core.records import EpisodeImage
from episodic.core.states import EpisodeState
from episodic.flows.artifacts import md_text
from episodic.pipeline.approval import ApprovalContext, approval_digest, hero_outputs
from episodic.pipeline.preview import PlanTexts, plan_texts
from episodic.pipeline.thumbnails import thumbnail_data_uri

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


class RefusalInput(ApprovalInput):
    """The form a run waits at after its answer lost to the decision on record: the same
    fields (an answer is read as an `ApprovalInput`), but it shows no images, so its
    decision speaks of the decision on record instead."""

    decision: Literal["approve", "reject"] = Field(
        description="The decision on record (above) stands whatever you answer: answer it "
        "to let this run go on; the other answer is refused again (a rejection needs a note)."
    )


def approval_input_for(outputs: list[EpisodeImage]) -> type[ApprovalInput]:
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


def form_digest(shown: dict[str, str], outputs: list[EpisodeImage]) -> str:
    """What a form is about: `approval_digest` of its images, and, with hero videos, which
    video each pick field names (sha256 hex). Equal digests: an answer means the same."""
    digest = approval_digest(shown)
    heroes = list(hero_outputs(outputs))
    if not heroes:
        return digest  # the key of forms without picks is unchanged
    return hashlib.sha256(f"{digest}|picks:{','.join(heroes)}".encode()).hexdigest()


def picks_of(answer: ApprovalInput, outputs: list[EpisodeImage]) -> dict[str, int] | None:
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


def approval_form_description(
    context: ApprovalContext,
    outputs: list[EpisodeImage] | None = None,
    refused: str | None = None,
) -> str:
    """The form's Markdown: exactly the images the decision is about (the current plan's),
    video by video in plan order, each under its title (from the frozen plan) with its id
    small beside it, its images as inline previews with their cost, its prompts collapsed;
    and the reason the last answer was refused."""
    episode_id = context.episode_id
    outputs = context.review_set() if outputs is None else outputs
    paid, costs = context.spend()
    lines = []
    if refused:
        lines += [f"> **Your last answer was not recorded:** {md_text(refused)}", ""]
    earlier = context.latest_decision()
    if earlier is not None and earlier.decision == EpisodeState.REJECTED:
        lines += [
            f"> **Rejected before:** {md_text(earlier.describe())}. The episode was "
            "re-planned or reopened since; below are the images of its current plan.",
            "",
        ]
    heroes = hero_outputs(outputs)
    lines += [
        f"## Approve episode {episode_id}",
        "",
        f"{len(outputs)} images; the episode cost {format_totals(costs)} in {paid} paid calls.",
    ]
    if heroes:
        lines += [
            "",
            f"{len(heroes)} hero video{'s' if len(heroes) > 1 else ''}: "
            f"{'each' if len(heroes) > 1 else 'it'} ships the one candidate you pick below "
            "(the fields *the candidate that ships*).",
        ]
    texts = plan_texts(context.engine, context.episode_pk, episode_id, context.pipeline)
    shown = 0
    for video, images in _by_video(outputs).items():
        title = md_text(texts.title(video), limit=300)
        candidates = heroes.get(video)
        pick = f": pick one of {len(candidates)} candidates" if candidates else ""
        lines += ["", f"### {title} `{video}`{pick}", ""]
        lines += [f"| {'candidate' if candidates else 'part'} | preview | cost | id |"]
        lines += ["|---|---|---|---|"]
        for o in images:
            label = o.item_id
            # the bytes the media store holds, checked against the sha256 paid for: a form
            # on any machine shows what ships
            uri = thumbnail_data_uri(context.image_bytes(o)) if shown < MAX_PREVIEWS else None
            shown += 1
            preview = f"![{label}]({uri})" if uri else f"`{o.key or o.legacy_path}`"
            cost = format_money(o.cost_micros, o.currency)
            name = f"part {o.part}" if o.candidate is None else f"candidate {o.candidate}"
            lines.append(f"| {name} | {preview} | {cost} | `{label}` `{o.sha256[:12]}` |")
        lines += ["", prompts_details(images, texts)]
    return "\n".join(lines)


def _by_video(outputs: list[EpisodeImage]) -> dict[str, list[EpisodeImage]]:
    """`outputs` grouped by video, in plan order."""
    videos: dict[str, list[EpisodeImage]] = {}
    for output in outputs:
        videos.setdefault(output.video_id, []).append(output)
    return videos


def prompts_details(images: list[EpisodeImage], texts: PlanTexts) -> str:
    """The prompts `images` were generated from, collapsed: one HTML block (Prefect's UI
    renders a block of HTML through its sanitizer, and `<details>` is allowed), on one line
    so Markdown ends it at the next blank line; every prompt HTML-escaped (Markdown is not
    read inside HTML). Candidates of one hero video share their prompt, shown once."""
    seen: dict[str, list[str]] = {}
    for image in images:
        prompt = texts.prompts.get(image.idempotency_key)
        if prompt is not None:
            seen.setdefault(prompt, []).append(image.item_id)
    if not seen:
        return ""
    body = "".join(
        f"<p><code>{html.escape(', '.join(items))}</code> "
        f"{html.escape(' '.join(prompt.split()))}</p>"
        for prompt, items in seen.items()
    )
    return f"<details><summary>Prompt{'s' if len(seen) > 1 else ''}</summary>{body}</details>"
