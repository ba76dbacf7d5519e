"""Deciding a generated episode: who decided what, and when.

A decision is bound to the images it is about (the current plan's completed images, each
file checked against the sha256 the ledger paid for), and it stands: the other decision is
refused until the plan changes or the episode is reopened, with who decided, when and why.
`approval_context` gives a Prefect flow what deciding needs without a store of its own.

Images are read from the media store (`episodic.storage.media.MediaStore`) by their recorded key, so
a decision taken on another machine than the one that paid sees the same bytes; a row from
before the store (only a ``legacy_path``) is read from that local file, as it always was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import (
    CommandNotAllowed,
    ImageNotAsPaid,
    ImagesChangedSinceShown,
    InvalidInput,
    MediaMissing,
)
from episodic.core.hints import hint
from episodic.core.ids import EpisodeId
from episodic.core.playlist import check_picks, check_text
from episodic.core.records import EpisodeImage
from episodic.core.settings import load_settings
from episodic.core.states import DECIDED_STATES, REOPENABLE_STATES, EpisodeState
from episodic.pipeline.gate import GatePass, open_gate
from episodic.pipeline.playlists import planned_items
from episodic.storage.approvals import ApprovalStore, RecordedDecision
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.ledger import LedgerStore, completed_outputs
from episodic.storage.locks import keyed_transaction
from episodic.storage.media import MediaStore
from episodic.storage.plans import PlanStore
from episodic.storage.store_identity import open_verified

#: What a decision outside the form says when no Prefect API is configured to resume the run
#: waiting for it (`episodic approve` without PREFECT_API_URL; the decision is recorded).
NO_PREFECT_API = "no Prefect API configured (PREFECT_API_URL): no waiting flow run was resumed"


def validate_person(name: str, what: str = "--by") -> str:
    """A person's name as recorded with a decision: 1-100 printable characters, no controls.
    `what` names the field in the error (a CLI flag, or a form field in the Prefect UI)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or not name.isprintable():
        raise InvalidInput(f"{what} needs a name (1-100 printable characters)")
    return check_text(name.strip(), what)


def approval_digest(items: dict[str, str]) -> str:
    """sha256 (hex) of what a reviewer is shown: item key -> image sha256, canonical JSON."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def review_set(
    engine: Engine, pipeline: str, episode_id: str, store: MediaStore | None = None
) -> list[EpisodeImage]:
    """The images a decision is about: the current plan's completed images, in plan order,
    each checked in `store` against its recorded sha256 (what the approval form shows)."""
    gate = open_gate(engine, pipeline, episode_id, "approve")
    return [image for image, _ in planned_images(engine, gate, store)]


def default_store(store: MediaStore | None, engine: Engine) -> MediaStore:
    """`store`, or the one the settings name, if it is the database's (`open_verified`)."""
    return store if store is not None else open_verified(load_settings(), engine)


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
    store: MediaStore | None = None,
) -> dict[str, Any]:
    """Approve or reject a generated episode. Refused unless it is waiting for a decision.
    The images are checked in `store` (default: the settings' media store).

    `expected_digest` (`approval_digest` of the images the reviewer was shown, e.g. by the
    Prefect form) binds the decision to them: if the plan or its images changed since, the
    decision is refused (`ImagesChangedSinceShown`, a `CommandNotAllowed`) and nothing is
    recorded.
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
    if approve or expected_digest is not None:  # checked in the store now: exactly this ships
        outputs = [image for image, _ in planned_images(engine, gate, store)]
        shown = {o.idempotency_key: o.sha256 for o in outputs}
        if expected_digest is not None and approval_digest(shown) != expected_digest:
            raise ImagesChangedSinceShown(
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
        if lost_to.decision == wanted and (not approve or lost_to.picks == (chosen or {})):
            return {"episode_id": gate.episode_id, "state": lost_to.state, "changed": False}
        mine = f"{wanted.value}{' with the picks ' + _picks_text(chosen) if chosen else ''}"
        raise CommandNotAllowed(
            f"episode {gate.episode_id} was just {lost_to.describe()}; this decision "
            f"({mine}) was not recorded: " + decision_stands_hint(gate.episode_id, lost_to.state)
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


def hero_outputs(outputs: list[EpisodeImage]) -> dict[str, list[EpisodeImage]]:
    """The hero videos among `outputs` (plan order): video id -> its candidates' images,
    in candidate order."""
    heroes: dict[str, list[EpisodeImage]] = {}
    for output in outputs:
        if output.candidate is not None:
            heroes.setdefault(output.video_id, []).append(output)
    return heroes


def _picks_text(picks: dict[str, int]) -> str:
    return ",".join(f"{video}={pick}" for video, pick in picks.items())


def reopen(
    engine: Engine,
    pipeline: str,
    episode_id: str,
    *,
    by: str,
    reason: str,
    store: MediaStore | None = None,
) -> dict[str, Any]:
    """Undo a decision, recording who and why: an approved or assembled episode's plan is
    unfrozen and its approval reset; a rejected episode's images may be reviewed again as
    they are. The episode is `allocated` until its plan is generated (nothing to pay for
    images that exist) and it is decided again. History keeps the earlier plan, decision
    and media. Refused for other states (exit 2). ``missing``: the completed images the
    media store (`store`, default the settings') no longer holds, which a new generate
    would not buy again and approval would refuse: `episodic media restore` brings them
    back at no cost."""
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
    media = default_store(store, engine)
    missing = [
        o.item_id
        for o in completed_outputs(engine, gate.episode_pk)
        if not (media.exists(o.key) if o.key else Path(o.legacy_path or "").is_file())
    ]
    return {
        "episode_id": gate.episode_id,
        "state": "allocated",
        "changed": moved,
        "from": state,
        "missing": missing,
    }


def planned_images(
    engine: Engine, gate: GatePass, store: MediaStore | None = None
) -> list[tuple[EpisodeImage, bytes]]:
    """The current plan's completed images in plan order, each with its bytes as read from
    `store` (default: the settings' store) and checked against the sha256 and size recorded
    when it was paid for. Raises CommandNotAllowed (no plan, images not completed) or
    ImageNotAsPaid (an image missing from the store or not the bytes paid for); a store that
    cannot answer raises its MediaStoreError."""
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
        (o for o in completed_outputs(engine, gate.episode_pk) if o.idempotency_key in planned),
        key=lambda o: order[o.idempotency_key],
    )
    if len(outputs) != len(planned):
        raise CommandNotAllowed(f"{len(planned) - len(outputs)} planned images are not completed")
    if not outputs:
        raise CommandNotAllowed("episode has no completed images")
    media = default_store(store, engine)
    # never decide on or assemble from bytes that are not what the ledger paid for
    return [(output, paid_bytes(media, gate.episode_id, output)) for output in outputs]


def paid_bytes(store: MediaStore, episode_id: str, image: EpisodeImage) -> bytes:
    """`image`'s bytes: from `store` under its key, or, for a row from before the store
    (no key), from its legacy local file. Raises ImageNotAsPaid when they are missing or
    differ from the sha256 (and size) recorded when the image was paid for."""
    where = image_location(store, image)
    try:
        if image.key is not None:
            content = store.read(image.key)
        elif image.legacy_path is not None:
            content = Path(image.legacy_path).read_bytes()
        else:
            raise image_not_as_paid(episode_id, image.item_id, where, "has no recorded key")
    except (MediaMissing, FileNotFoundError, IsADirectoryError):
        raise image_not_as_paid(episode_id, image.item_id, where, "is missing") from None
    if (image.size is not None and len(content) != image.size) or hashlib.sha256(
        content
    ).hexdigest() != image.sha256:
        raise image_not_as_paid(
            episode_id,
            image.item_id,
            where,
            "does not match the sha256 recorded when it was paid for",
        )
    return content


def image_location(store: MediaStore, image: EpisodeImage) -> str:
    """Where `image` is read from, as messages name it: its key in the store, or the legacy
    local file of a row from before the store."""
    if image.key is not None:
        return f"{image.key} in the media store {store.describe()}"
    return image.legacy_path or "no recorded file"


def image_not_as_paid(episode_id: str, label: str, where: str, what: str) -> ImageNotAsPaid:
    """An image changed or gone since the ledger recorded it: nothing is decided or
    assembled from it (exit 2), and the message names where it was read and the next step."""
    return ImageNotAsPaid(
        f"episode {episode_id}: image {label} ({where}) {what}; nothing was done: "
        + hint(
            f"`episodic check {episode_id}` lists every such image; `episodic media restore "
            f"{episode_id}` fetches lost ones again from the provider at no cost",
            "the check deployment lists every such image; restore lost ones "
            "(`episodic media restore`) at no cost",
        )
    )


def waiting_state(engine: Engine, pipeline: str, episode_id: str) -> str:
    """The episode's state, refused (`CommandNotAllowed`) unless it waits for a decision
    or has one (generated, approved, rejected, assembled)."""
    state = EpisodeRepository(engine).get(pipeline, EpisodeId.parse(episode_id)).state
    if state != EpisodeState.GENERATED and state not in DECIDED_STATES:
        raise CommandNotAllowed(
            f"episode {episode_id} is {state}: only a generated episode waits for approval"
        )
    return str(state)


@dataclass(frozen=True, slots=True)
class ApprovalContext:
    """What a flow that waits for a decision reads and records, without a store of its own.
    Each method reads (or decides) when it is called: nothing is cached, since the episode
    may be decided elsewhere while the flow waits."""

    engine: Engine
    pipeline: str
    episode_id: str
    episode_pk: int
    store: MediaStore | None = field(default=None, compare=False)  # None: the settings'

    def state(self) -> str:
        """The episode's state now."""
        return str(EpisodeRepository(self.engine).state(self.episode_pk))

    def latest_decision(self) -> RecordedDecision | None:
        """The decision on record (None: never decided)."""
        return ApprovalStore(self.engine).latest_decision(self.episode_pk)

    def spend(self) -> tuple[int, dict[str, int]]:
        """(paid submissions, cost in micro-units per currency) of the episode over every
        run (`LedgerStore.episode_spend`)."""
        return LedgerStore(self.engine).episode_spend(self.episode_pk)

    def review_set(self) -> list[EpisodeImage]:
        """`review_set` of this episode: the images a decision is about."""
        return review_set(self.engine, self.pipeline, self.episode_id, self.store)

    def image_bytes(self, image: EpisodeImage) -> bytes | None:
        """`image`'s bytes as the store holds them (checked against its recorded sha256),
        for a preview; None when they are missing or not as paid for."""
        try:
            return paid_bytes(default_store(self.store, self.engine), self.episode_id, image)
        except ImageNotAsPaid:
            return None

    def decide(self, **decision: Any) -> dict[str, Any]:
        """`decide` on this episode (same keywords, answers and errors)."""
        decision.setdefault("store", self.store)
        return decide(self.engine, self.pipeline, self.episode_id, **decision)

    def wait_tag(self) -> str:
        """Tag of the flow run that waits for this episode's decision (one per episode). It
        names the episode's row in this database (key and creation time), so two databases
        that share a Prefect server (staging and production) never see each other's
        waiting runs."""
        episode, pk = EpisodeRepository(self.engine).locate(
            self.pipeline, EpisodeId.parse(self.episode_id)
        )
        row = hashlib.sha256(f"{pk}@{episode.created_at.isoformat()}".encode()).hexdigest()[:12]
        return f"episodic-approval:{self.pipeline}/{self.episode_id}/{row}"

    @contextmanager
    def one_waiter(self) -> Iterator[None]:
        """Serialize, across processes, the flow runs choosing which of them waits for this
        episode's decision (a write transaction on the key ``approval-wait:P:E``)."""
        with keyed_transaction(self.engine, f"approval-wait:{self.pipeline}:{self.episode_id}"):
            yield


def approval_context(
    engine: Engine, pipeline: str, episode_id: str, store: MediaStore | None = None
) -> ApprovalContext:
    """The context of `episode_id` (its row key read once); its images are read from
    `store` (default: the settings' media store, opened once here)."""
    return ApprovalContext(
        engine,
        pipeline,
        episode_id,
        EpisodeRepository(engine).episode_pk(pipeline, episode_id),
        default_store(store, engine),
    )
