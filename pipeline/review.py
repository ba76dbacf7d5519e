"""Approval and assembly of a generated episode (DESIGN 7).

Approval records who decided what, and when. Assembly composes the cover from the approved
images and writes a manifest; it is deterministic (same approved inputs, same bytes), records
the hashes, and rerunning it changes nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from core.errors import CommandNotAllowed, ImageNotAsPaid, InvalidInput
from core.hints import hint
from core.playlist import check_picks, check_text, item_label
from core.settings import Settings
from core.states import DECIDED_STATES, REOPENABLE_STATES, EpisodeState
from pipeline.gate import GatePass, open_gate
from pipeline.media import write_atomically
from pipeline.playlists import planned_items
from storage.approvals import ApprovalStore, RecordedDecision
from storage.episodes import EpisodeRepository
from storage.ledger import completed_outputs
from storage.plans import PlanStore

THUMB = 128


def validate_person(name: str, what: str = "--by") -> str:
    """A person's name as recorded with a decision: 1-100 printable characters, no controls.
    `what` names the field in the error (a CLI flag, or a form field in the Prefect UI)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or not name.isprintable():
        raise InvalidInput(f"{what} needs a name (1-100 printable characters)")
    return check_text(name.strip(), what)


def approval_digest(items: dict[str, str]) -> str:
    """sha256 (hex) of what a reviewer is shown: item key -> image sha256, canonical JSON."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def review_set(engine: Engine, pipeline: str, episode_id: str) -> list[dict[str, Any]]:
    """The images a decision is about: the current plan's completed images, in plan order,
    each file checked against its recorded sha256 (what the approval form shows)."""
    return _planned_outputs(engine, open_gate(engine, pipeline, episode_id, "approve"))


def decide(
    engine: Engine,
    pipeline: str,
    episode_id: str,
    *,
    approve: bool,
    by: str,
    note: str | None,
    expected_digest: str | None = None,
    labels: tuple[str, str] = ("--by", "--reason"),
    picks: dict[str, int] | None = None,
    picks_label: str = "--pick",
) -> dict[str, Any]:
    """Approve or reject a generated episode. Refused unless it is waiting for a decision.

    `expected_digest` (`approval_digest` of the images the reviewer was shown, e.g. by the
    Prefect form) binds the decision to them: if the plan or its images changed since, the
    decision is refused (`CommandNotAllowed`) and nothing is recorded.
    `picks` (video id -> candidate, 1-based): an approval of a plan with hero runs names
    the candidate that ships for every hero video; a missing pick, one outside the video's
    candidates or one for a video without candidates is `InvalidInput` (exit 2), and nothing
    is recorded."""
    by_label, note_label = labels  # how the caller's person named the fields
    by = validate_person(by, by_label)
    if not approve and not (note and note.strip()):
        raise InvalidInput(f"a rejection needs a reason ({note_label})")
    if not approve and picks:
        raise InvalidInput(f"{picks_label} is for approving: a rejection ships nothing")
    if note is not None:
        check_text(note, note_label)
    gate = open_gate(engine, pipeline, episode_id, "approve")
    review = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    state = episodes.state(gate.episode_pk)
    wanted = EpisodeState.APPROVED if approve else EpisodeState.REJECTED
    already = state == wanted or (approve and state == EpisodeState.ASSEMBLED)
    if already:  # the same decision again (a retried flow, a double click): a no-op
        recorded = review.approved_picks(gate.episode_pk) if approve else {}
        if picks and picks != recorded:
            decided = review.latest_decision(gate.episode_pk)
            who = f" (by {decided.by} at {decided.at:%Y-%m-%d %H:%M} UTC)" if decided else ""
            raise CommandNotAllowed(
                f"episode {gate.episode_id} is already {state} with the picks "
                f"{_picks_text(recorded) or '(none)'}{who}; this decision (the picks "
                f"{_picks_text(picks)}) was not recorded: "
                + decision_stands_hint(gate.episode_id, state)
            )
        return {"episode_id": gate.episode_id, "state": state, "changed": False}
    if state in DECIDED_STATES:  # the other decision stands: name it and the way back
        decided = review.latest_decision(gate.episode_pk)
        raise CommandNotAllowed(
            f"episode {gate.episode_id} was "
            f"{decided.describe() if decided else state}; this decision was not recorded: "
            + decision_stands_hint(gate.episode_id, state)
        )
    if state != EpisodeState.GENERATED:
        raise CommandNotAllowed(
            f"episode {gate.episode_id} is {state}: only a generated episode can be "
            f"{'approved' if approve else 'rejected'}"
        )
    approved_items: dict[str, str] | None = None
    chosen: dict[str, int] | None = None
    if approve or expected_digest is not None:  # checked on disk now: exactly this ships
        outputs = _planned_outputs(engine, gate)
        shown = {o["idempotency_key"]: o["output_sha256"] for o in outputs}
        if expected_digest is not None and approval_digest(shown) != expected_digest:
            raise CommandNotAllowed(
                f"episode {gate.episode_id}: its images changed since they were shown for "
                "review; nothing was recorded: review them again"
            )
        approved_items = shown if approve else None
        if approve:
            heroes = hero_outputs(outputs)
            if not heroes and picks:
                raise InvalidInput(
                    f"{picks_label}: episode {gate.episode_id} has no hero candidates"
                )
            chosen = check_picks(picks or {}, heroes, picks_label) if heroes else None
    lost_to = review.decide(gate.episode_pk, approve, by, note, items=approved_items, picks=chosen)
    if isinstance(lost_to, RecordedDecision):  # a concurrent decision won the compare-and-set
        if lost_to.decision == wanted.value and (not approve or lost_to.picks == (chosen or {})):
            return {"episode_id": gate.episode_id, "state": lost_to.state, "changed": False}
        mine = f"{wanted.value}{' with the picks ' + _picks_text(chosen) if chosen else ''}"
        raise CommandNotAllowed(
            f"episode {gate.episode_id} was just {lost_to.describe()}; this decision "
            f"({mine}) was not recorded: "
            + decision_stands_hint(gate.episode_id, EpisodeState(lost_to.state))
        )
    if lost_to is not None:  # moved meanwhile without a decision (re-planned)
        raise CommandNotAllowed(
            f"episode {gate.episode_id} became {lost_to} meanwhile (re-planned); this "
            "decision was not recorded: review its current images"
        )
    answer: dict[str, Any] = {
        "episode_id": gate.episode_id,
        "state": wanted.value,
        "changed": True,
        "by": by,
    }
    if chosen:
        answer["picks"] = chosen
    return answer


def decision_stands_hint(episode_id: str, state: str) -> str:
    """What to do about a decision that stands: a rejection until a changed plan or a
    recorded reopen, an approval until a reopen (worded for the current surface)."""
    if state == EpisodeState.REJECTED:
        return hint(
            f"a rejection stands until the plan changes: re-plan it with a changed playlist "
            f"(`episodic plan {episode_id} --playlist FILE`) or "
            f"`episodic reopen {episode_id} --by NAME --reason TEXT` to review these images "
            "again",
            "a rejection stands until the plan changes: record a changed playlist (the plan "
            "deployment or `episodic plan`) and retry, or reopen it (`episodic reopen`) to "
            "review these images again",
        )
    return hint(
        f"`episodic reopen {episode_id} --by NAME --reason TEXT` to decide again",
        "reopen it (`episodic reopen`) to decide again",
    )


def rejection_note(engine: Engine, episode_pk: int, episode_id: str) -> str | None:
    """For a rejected episode, the clause a command that changed nothing adds to its answer
    (`E stays rejected (by bob at …: too dark): …`); None for any other state."""
    decided = ApprovalStore(engine).latest_decision(episode_pk)
    if decided is None or decided.state != EpisodeState.REJECTED:
        return None
    return f"{episode_id} stays {decided.describe()}: " + decision_stands_hint(
        episode_id, EpisodeState.REJECTED
    )


def hero_outputs(outputs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The hero videos among `outputs` (plan order): video id -> its candidates' outputs,
    in candidate order."""
    heroes: dict[str, list[dict[str, Any]]] = {}
    for output in outputs:
        if output.get("candidate") is not None:
            heroes.setdefault(output["video_id"], []).append(output)
    return heroes


def _picks_text(picks: dict[str, int]) -> str:
    return ",".join(f"{video}={pick}" for video, pick in picks.items())


def assemble(engine: Engine, settings: Settings, pipeline: str, episode_id: str) -> dict[str, Any]:
    """Compose the cover and the manifest of an approved episode; record their hashes."""
    gate = open_gate(engine, pipeline, episode_id, "assemble")
    review = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    state = episodes.state(gate.episode_pk)
    if state not in (EpisodeState.APPROVED, EpisodeState.ASSEMBLED):
        raise CommandNotAllowed(
            f"episode {gate.episode_id} is {state}: only an approved episode is assembled"
        )
    outputs = _planned_outputs(engine, gate)
    approved = review.approved_items(gate.episode_pk)
    shipping = {o["idempotency_key"]: o["output_sha256"] for o in outputs}
    if approved is not None and shipping != approved:
        raise CommandNotAllowed(
            f"episode {gate.episode_id}: its images are not the ones that were approved "
            f"({len(set(shipping.items()) ^ set(approved.items()))} differ); nothing was "
            "assembled: "
            + hint(
                f"`episodic reopen {gate.episode_id}` and review it again",
                "reopen it (`episodic reopen`) and run the approve deployment again",
            )
        )
    heroes = hero_outputs(outputs)
    picks = review.approved_picks(gate.episode_pk)
    if heroes:
        try:
            check_picks(picks, heroes, "the approval's picks")
        except InvalidInput as exc:
            raise CommandNotAllowed(
                f"episode {gate.episode_id}: {exc}; nothing was assembled: "
                + hint(
                    f"`episodic reopen {gate.episode_id}` and approve it again with --pick",
                    "reopen it (`episodic reopen`) and approve it again with a pick",
                )
            ) from None
    shipped = [o for o in outputs if o.get("candidate") in (None, picks.get(o["video_id"]))]
    folder = settings.episode_folder(gate.pipeline, gate.episode_id)
    cover = _cover([Path(o["output_path"]) for o in shipped])
    cover_sha = write_atomically(folder / "cover.png", cover)
    manifest = _manifest(gate.episode_id, shipped, folder, cover_sha, heroes, picks)
    manifest_sha = write_atomically(folder / "manifest.json", manifest)
    media = {
        "cover": (str(folder / "cover.png"), cover_sha),
        "manifest": (str(folder / "manifest.json"), manifest_sha),
    }
    changed = episodes.record_media(gate.episode_pk, media)
    if state == EpisodeState.APPROVED:
        episodes.transition(
            gate.episode_pk,
            EpisodeState.ASSEMBLED,
            {"cover_sha256": cover_sha, "manifest_sha256": manifest_sha},
        )
    return {
        "episode_id": gate.episode_id,
        "state": EpisodeState.ASSEMBLED.value,
        "changed": changed or state == EpisodeState.APPROVED,
        "cover": media["cover"][0],
        "cover_sha256": cover_sha,
        "manifest": media["manifest"][0],
        "manifest_sha256": manifest_sha,
        "images": len(shipped),
        **({"picks": picks} if heroes else {}),
    }


def reopen(
    engine: Engine, pipeline: str, episode_id: str, *, by: str, reason: str
) -> dict[str, Any]:
    """Undo a decision, recording who and why: an approved or assembled episode's plan is
    unfrozen and its approval reset; a rejected episode's images may be reviewed again as
    they are. The episode is `allocated` until its plan is generated (nothing to pay for
    images that exist) and it is decided again. History keeps the earlier plan, decision
    and media. Refused for other states (exit 2)."""
    by = validate_person(by)
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 2000:
        raise InvalidInput("reopen needs --reason (1-2000 characters)")
    check_text(reason, "--reason")
    gate = open_gate(engine, pipeline, episode_id, "reopen")
    episodes = EpisodeRepository(engine)
    state = EpisodeState(episodes.state(gate.episode_pk))
    if state not in REOPENABLE_STATES:
        raise CommandNotAllowed(
            f"episode {gate.episode_id} is {state}: only an approved, assembled or rejected "
            "episode is reopened (its plan can be changed with `episodic plan` as it is)"
        )
    moved = episodes.transition(
        gate.episode_pk,
        EpisodeState.ALLOCATED,
        {"reopened_by": by, "reason": reason.strip(), "from": state.value},
    )
    return {"episode_id": gate.episode_id, "state": "allocated", "changed": moved, "from": state}


def _planned_outputs(engine: Engine, gate: GatePass) -> list[dict[str, Any]]:
    """The current plan's completed images, each file checked against its recorded sha256."""
    recorded = PlanStore(engine).latest_plan(gate.episode_pk)
    if recorded is None:
        raise CommandNotAllowed("episode has no plan")
    order = {  # the plan's order (a re-planned playlist may reorder existing images)
        it.idempotency_key: n
        for n, it in enumerate(
            planned_items(recorded[0], recorded[1], gate.episode_id, gate.pipeline)
        )
    }
    planned = set(order)
    outputs = sorted(
        (o for o in completed_outputs(engine, gate.episode_pk) if o["idempotency_key"] in planned),
        key=lambda o: order[o["idempotency_key"]],
    )
    if len(outputs) != len(planned):
        raise CommandNotAllowed(f"{len(planned) - len(outputs)} planned images are not completed")
    for output in outputs:  # never assemble from files that are not what the ledger paid for
        path = Path(output["output_path"])
        label = item_label(output["video_id"], output["part"], output.get("candidate"))
        if not path.is_file():
            raise image_not_as_paid(gate.episode_id, label, path, "is missing")
        if hashlib.sha256(path.read_bytes()).hexdigest() != output["output_sha256"]:
            raise image_not_as_paid(
                gate.episode_id,
                label,
                path,
                "does not match the sha256 recorded when it was paid for",
            )
    if not outputs:
        raise CommandNotAllowed("episode has no completed images")
    return outputs


def image_not_as_paid(episode_id: str, label: str, path: Path, what: str) -> ImageNotAsPaid:
    """An image file changed or gone since the ledger recorded it: nothing is decided or
    assembled from it (exit 2), and the message names the file and the next step."""
    return ImageNotAsPaid(
        f"episode {episode_id}: image {label} ({path}) {what}; nothing was done: "
        + hint(
            f"`episodic check {episode_id}` lists every such file; put the paid-for file back "
            "(the ledger and `episodes show` name its sha256)",
            "the check deployment lists every such file; put the paid-for file back",
        )
    )


def _cover(paths: list[Path]) -> bytes:
    """A grid of thumbnails in playlist order: same inputs, same PNG bytes."""
    from PIL import Image

    columns = math.ceil(math.sqrt(len(paths)))
    rows = math.ceil(len(paths) / columns)
    sheet = Image.new("RGB", (columns * THUMB, rows * THUMB), (16, 16, 16))
    for n, path in enumerate(paths):
        with Image.open(path) as image:
            thumb = image.convert("RGB").resize((THUMB, THUMB), Image.Resampling.NEAREST)
        sheet.paste(thumb, ((n % columns) * THUMB, (n // columns) * THUMB))
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=False)
    return out.getvalue()


def _manifest(
    episode_id: str,
    shipped: list[dict[str, Any]],
    folder: Path,
    cover_sha: str,
    heroes: dict[str, list[dict[str, Any]]],
    picks: dict[str, int],
) -> bytes:
    """Canonical JSON, paths relative to the episode folder, no timestamps: deterministic.

    `items`: the images that ship (a hero video's picked candidate among them). With hero
    runs, `heroes` records each hero video's pick and every candidate's key, sha256 and
    cost, and `total_cost_minor` counts every paid candidate, picked or not."""
    items = []
    for o in shipped:
        item = {
            "item_id": item_label(o["video_id"], o["part"], o.get("candidate")),
            "idempotency_key": o["idempotency_key"],
            # relative to the episode folder (images of an older layout may sit elsewhere)
            "path": os.path.relpath(o["output_path"], folder),
            "sha256": o["output_sha256"],
            "remote_ref": o["remote_ref"],
            "cost_minor": o["amount_minor"],
            "currency": o["currency"],
        }
        if o.get("candidate") is not None:
            item["candidate"] = o["candidate"]
        items.append(item)
    unpicked = [c for video, cs in heroes.items() for c in cs if c["candidate"] != picks.get(video)]
    document: dict[str, Any] = {
        "episode_id": episode_id,
        "cover": {"path": "cover.png", "sha256": cover_sha},
        "items": items,
        "total_cost_minor": sum(o["amount_minor"] for o in [*shipped, *unpicked]),
        "currency": shipped[0]["currency"],
    }
    if heroes:
        document["heroes"] = [
            {
                "video_id": video,
                "picked": picks[video],
                "candidates": [
                    {
                        "candidate": c["candidate"],
                        "idempotency_key": c["idempotency_key"],
                        "sha256": c["output_sha256"],
                        "remote_ref": c["remote_ref"],
                        "cost_minor": c["amount_minor"],
                    }
                    for c in candidates
                ],
            }
            for video, candidates in heroes.items()
        ]
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
