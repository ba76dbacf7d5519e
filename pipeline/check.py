"""`episodic check`: a read-only audit of episodes, their files and the ledger.

It opens the database read-only (SQLite ``mode=ro``, Postgres read-only transactions) and
only reads files; each problem is one finding. Clean: exit 0; findings: exit 1. The rows come
as plain records of one snapshot per episode (`episodic.storage.audit`).

The rules it audits (a completed item has exactly one succeeded submission, an item held by
a live claim, an accepted job left uncollected, which cancel answers leave nothing to
collect, ...) are encoded here again, on purpose, and not imported from the code that keeps
them: an auditor that shares a predicate with the code it audits is blind to a bug in it.
The one exception is a run's liveness, read with the choke point's own SQL predicate
(`RunRecord.active`), so that `check` and the dedup agree on which run may still finish.

Media are read from the media store (`episodic.storage.media.MediaStore`) by their recorded keys:
every completed image, cover and manifest must be in it, hold exactly the recorded size and
sha256, and decode (an image in full with Pillow, a manifest as JSON), each rule checked
here on the bytes themselves. A row from before the store (only a local ``path``) is checked
on that file as before, and `legacy_warnings` says it should be imported into the store.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import EpisodicError, InvalidInput
from episodic.core.ids import EpisodeId
from episodic.core.playlist import PlannedItem, check_picks, hero_candidates, item_label
from episodic.core.states import (
    FROZEN_PLAN_STATES,
    UNSETTLED_SUBMISSION_STATES,
    EpisodeState,
    ItemState,
    RunState,
    SubmissionState,
)
from episodic.pipeline.check_lost import check_lost_at_provider
from episodic.pipeline.check_media import MediaAudit, Recorded, legacy_media
from episodic.pipeline.check_spend import check_costs, check_reservations
from episodic.pipeline.playlists import planned_items
from episodic.storage.admission import DedupPolicy
from episodic.storage.approvals import approved_picks
from episodic.storage.audit import (
    CostRecord,
    EpisodeRecord,
    ItemRecord,
    MediaRecord,
    RunRecord,
    SubmissionRecord,
    list_episodes,
    snapshot,
)
from episodic.storage.base import utcnow
from episodic.storage.media import MediaStore

NEEDS_ALL_IMAGES = {EpisodeState.GENERATED, EpisodeState.APPROVED, EpisodeState.ASSEMBLED}


@dataclass(frozen=True, slots=True)
class Finding:
    episode_id: str
    check: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# The provider answers to a cancel that leave nothing to collect (the fake's and Replicate's
# statuses, fal's; a job that had finished or failed is still collected, with its cost):
# `check` keeps its own list, as an auditor, rather than the cancel's.
_STOPPED_BY_CANCEL = frozenset({"canceled", "cancelled", "cancellation_requested", "not_found"})
# How many cost entries a submission in each state has (any other state: none).
_COST_ENTRIES: dict[str, set[int]] = {
    SubmissionState.SUCCEEDED: {1},
    SubmissionState.FAILED: {0, 1},
}


def check_episodes(
    engine: Engine,
    pipeline: str,
    episode_id: str | None = None,
    policy: DedupPolicy | None = None,
    *,
    store: MediaStore | None = None,
) -> list[Finding]:
    """Every finding for the pipeline's episodes (or one). `policy` gives the pending TTL
    and fallback lease by which stuck runs are judged (default: the built-in defaults);
    media are read from `store` (default: the settings' media store). A store that cannot
    answer raises its MediaStoreError: an outage is not a finding about the media."""
    policy = policy or DedupPolicy()
    if store is None:
        from episodic.core.settings import load_settings
        from episodic.pipeline.media_view import open_store

        store = open_store(load_settings(), engine)
    wanted = None if episode_id is None else str(EpisodeId.parse(episode_id))
    episodes = list_episodes(engine, pipeline, wanted)
    if episode_id is not None and not episodes:
        from episodic.core.errors import EpisodeNotFound
        from episodic.storage.engine import database_label

        raise EpisodeNotFound(pipeline, episode_id, database_label(engine))
    findings: list[Finding] = []
    for episode in episodes:
        findings.extend(_check_one(engine, episode, policy, MediaAudit(store)))
    return findings


def _check_one(
    engine: Engine, episode: EpisodeRecord, policy: DedupPolicy, media: MediaAudit
) -> list[Finding]:
    eid = episode.episode_id
    out: list[Finding] = []

    def add(check: str, detail: str) -> None:
        out.append(Finding(eid, check, detail))

    try:
        parsed = EpisodeId.parse(eid)
        if str(parsed.week) != episode.week_id or parsed.sequence != episode.sequence:
            add(
                "identity",
                f"id {eid} disagrees with week {episode.week_id} / sequence {episode.sequence}",
            )
    except EpisodicError as exc:
        add("identity", str(exc))
    # The episode, its plan and its approval are read again in the snapshot: the row
    # `check_episodes` listed is from an earlier moment, and an episode listed as allocated
    # whose run then completed, marked it generated and ended looked like a crash before it
    # was marked (all images completed, no live run).
    with snapshot(engine) as reader:
        seen = reader.episode(episode.id, policy)
    episode, items, subs, costs = seen.episode, seen.items, seen.submissions, seen.costs
    runs, latest_event, recorded, approval = seen.runs, seen.latest_event, seen.plan, seen.approval
    cancel_answers = {  # the provider's latest answer to a cancel, per submission
        d["submission"]: str(d.get("answer", "")).strip().lower()
        for d in seen.cancel_notes
        if isinstance(d, dict) and "submission" in d
    }
    reopened = isinstance(latest_event, dict) and "reopened_by" in latest_event
    _check_items(add, items, subs, media)
    now = utcnow()
    held = {  # items whose live claim holder is still working on them: not a finding yet
        item.id
        for item in items
        if item.state == ItemState.RUNNING
        and item.lease_expires_at is not None
        and item.lease_expires_at > now
    }
    _check_liveness(add, runs, items, now)
    _check_ledger(add, subs, costs, held, cancel_answers)
    check_lost_at_provider(add, episode, items, subs, costs)
    try:
        _check_states(
            add,
            episode,
            None if recorded is None else recorded[1:],
            approval,
            items,
            seen.media,
            media,
            migrated=seen.migrated,
            # A live run marks the episode when it ends; a reopened one waits for a new plan.
            unmarked_is_expected=reopened or any(run.active for run in runs),
        )
    except _PlanUnreadable as exc:
        add("plan", f"the recorded plan is refused by today's rules ({exc}): re-plan it")
    return out


def _check_items(
    add: Any, items: Sequence[ItemRecord], subs: Sequence[SubmissionRecord], media: MediaAudit
) -> None:
    """A completed item has its image in the media store and exactly one succeeded
    submission; no other item has one. A succeeded submission whose output was recorded
    lost (bought again by `media restore --buy-again`) was paid for but is no item's now."""
    succeeded = Counter(
        s.item_pk for s in subs if s.state == SubmissionState.SUCCEEDED and not s.output_lost
    )
    for item in items:
        if item.state == ItemState.COMPLETED:
            media.check(add, f"image {_label(item)}", Recorded.of_item(item), image=True)
            if succeeded[item.id] != 1:
                add(
                    "ledger",
                    f"completed item {_label(item)} has "
                    f"{succeeded[item.id]} succeeded submissions, expected 1",
                )
        elif succeeded[item.id]:
            add(
                "state",
                f"item {_label(item)} is {item.state} but has a succeeded submission",
            )


def _check_ledger(
    add: Any,
    subs: Sequence[SubmissionRecord],
    costs: Sequence[CostRecord],
    held: set[int],
    cancel_answers: dict[Any, str],
) -> None:
    """Each submission's remote reference and cost entries as its state requires, no open
    job left behind (but on an item a live claim still `held`, or one a cancel stopped), one
    submission per provider job, and every cost entry a submission's and not negative."""
    cost_by_sub = Counter(c.submission_pk for c in costs)
    sub_ids = {s.id: s for s in subs}
    for sub in subs:
        if (
            sub.state in (SubmissionState.ACCEPTED, SubmissionState.SUCCEEDED)
            and not sub.remote_ref
        ):
            add(
                "remote-refs",
                f"submission {sub.client_reference} is {sub.state} without a remote task reference",
            )
        allowed = _COST_ENTRIES.get(sub.state, {0})
        if cost_by_sub[sub.id] not in allowed:
            add(
                "ledger",
                f"submission {sub.client_reference} ({sub.state}) has "
                f"{cost_by_sub[sub.id]} cost entries, expected {' or '.join(map(str, allowed))}",
            )
        if sub.item_pk in held:
            continue
        if (
            sub.state == SubmissionState.ACCEPTED
            and cancel_answers.get(sub.id) in _STOPPED_BY_CANCEL
        ):
            continue  # cancelled (or gone) at the provider: nothing to collect, none billing
        if sub.state == SubmissionState.ACCEPTED:
            add(
                "ledger",
                f"provider job {sub.remote_ref} ({sub.client_reference}) was accepted but never "
                "collected: `episodic retry` collects it at no cost while the provider keeps "
                "its output (Replicate and fal: about an hour); once it is gone, retry records "
                "it lost and says how to buy it again",
            )
        elif sub.state in UNSETTLED_SUBMISSION_STATES:
            add(
                "ledger",
                f"submission {sub.client_reference} may have made a provider job that the "
                "ledger does not know (acceptance unknown): `episodic retry` asks the provider "
                "where it can; else find the job there and `episodic runs adopt RUN ITEM --job "
                "ID` (pays nothing)",
            )
    refs = Counter((s.provider_profile, s.remote_ref) for s in subs if s.remote_ref)
    for (profile, ref), times in refs.items():
        if times > 1:
            add("ledger", f"provider job {ref} of {profile} is recorded by {times} submissions")
    for cost in costs:
        if cost.submission_pk not in sub_ids:
            add("ledger", f"cost entry {cost.id} belongs to no submission of this episode")
        if cost.amount_micros < 0:
            add("ledger", f"cost entry {cost.id} is negative")
    check_costs(add, costs)  # each amount follows from its basis, quantity and unit price
    check_reservations(add, subs, costs)  # and none passes what its call was counted at


def _check_liveness(
    add: Any, runs: Sequence[RunRecord], items: Sequence[ItemRecord], now: Any
) -> None:
    """Runs and items that claim to be working but that no live process holds."""
    for run in runs:
        if run.active:
            continue
        if run.state == RunState.RUNNING:
            add(
                "liveness",
                f"run {run.id} is running but {_lapsed(run)}; its process is gone: "
                f"`episodic runs resume {run.id}` finishes it, `episodic sweep` fails it",
            )
        else:
            add(
                "liveness",
                f"run {run.id} has been pending since {run.created_at:%Y-%m-%d %H:%M:%S} UTC "
                "and never started: `episodic sweep` cancels it",
            )
    for item in items:
        if item.state == ItemState.RUNNING and (
            item.lease_expires_at is None or item.lease_expires_at <= now
        ):
            add(
                "liveness",
                f"item {_label(item)} is running but its claim expired: "
                "`episodic retry` continues it",
            )


def _lapsed(run: RunRecord) -> str:
    """When a dead running run's lease ran out and when a process last renewed it, as
    recorded: the renewal (``heartbeat_at``, written with every lease) is not the expiry
    (a lease later), and a run with no lease recorded is judged by its last sign of life."""
    if run.lease_expires_at is None:
        seen = run.heartbeat_at or run.started_at or run.created_at
        return f"no lease is recorded and its last sign of life was {seen:%Y-%m-%d %H:%M:%S} UTC"
    expired = f"its lease expired at {run.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC"
    if run.heartbeat_at is None:
        return expired
    return f"{expired} (last renewed {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"


def _check_states(
    add: Any,
    episode: EpisodeRecord,
    recorded: tuple[dict[str, Any], list[str]] | None,
    approval: dict[str, Any] | None,
    items: Sequence[ItemRecord],
    media: Sequence[MediaRecord],
    store: MediaAudit,
    *,
    migrated: bool,
    unmarked_is_expected: bool,
) -> None:
    state = episode.state
    expects_plan = state in NEEDS_ALL_IMAGES or (
        state == EpisodeState.ALLOCATED and items and not unmarked_is_expected
    )
    plan = _planned(recorded, episode) if expects_plan else None  # expanded once
    keys = None if plan is None else {it.idempotency_key for it in plan}
    if state in NEEDS_ALL_IMAGES and migrated:  # imported whole: no playlist, all images done
        if any(i.state != ItemState.COMPLETED for i in items):
            add("state", f"migrated episode is {state} but not every image is completed")
    elif state in NEEDS_ALL_IMAGES:
        if keys is None:
            add("state", f"episode is {state} but has no plan")
        else:
            done = {i.idempotency_key for i in items if i.state == ItemState.COMPLETED}
            if missing := keys - done:
                add(
                    "state",
                    f"episode is {state} but {len(missing)} planned images are not completed",
                )
    elif state == EpisodeState.ALLOCATED and items and not unmarked_is_expected and keys:
        done = {i.idempotency_key for i in items if i.state == ItemState.COMPLETED}
        if keys <= done:
            add(
                "state",
                "episode is allocated but every planned image is completed (a crash "
                f"before it was marked): `episodic retry {episode.episode_id}` marks it "
                "generated",
            )
    kinds = {m.kind: m for m in media}
    if state == EpisodeState.ASSEMBLED and set(kinds) != {"cover", "manifest"}:
        add("state", f"episode is assembled but its media are {sorted(kinds)}")
    held: dict[str, bytes | None] = {}
    for row in media:
        held[row.kind] = store.check(add, row.kind, Recorded.of_media(row), row.kind == "cover")
    heroes = hero_candidates(plan) if plan and state in FROZEN_PLAN_STATES else {}
    picks = approved_picks(approval) if heroes else {}
    if heroes:
        try:
            check_picks(picks, heroes, "the approval's picks")
        except InvalidInput as exc:
            add("picks", f"episode is {state} but {exc}")
    manifest = kinds.get("manifest")
    if manifest is not None and held.get("manifest") is not None:
        try:
            document = json.loads(held["manifest"] or b"")
            # An earlier assembly's manifest stays recorded while the episode is reopened,
            # re-generated or approved again: it is checked against the plan and the
            # approval only when it is the assembly of them.
            assembled = state == EpisodeState.ASSEMBLED
            _check_manifest(add, document, items, heroes if assembled else None, picks)
        except (ValueError, KeyError, TypeError, AttributeError):
            add("files", "manifest is not a valid manifest")


def _check_manifest(
    add: Any,
    document: dict[str, Any],
    items: Sequence[ItemRecord],
    heroes: dict[str, list[PlannedItem]] | None,
    picks: dict[str, int],
) -> None:
    """The manifest's total is what its items and unpicked candidates cost; with `heroes`
    (the assembled plan's), its hero picks are the approval's, each hero video ships its
    picked candidate, and every candidate's sha256 is the ledger's."""
    listed = {h["video_id"]: h for h in document.get("heroes", [])}
    unpicked = sum(
        c["cost_micros"]
        for h in listed.values()
        for c in h["candidates"]
        if c["candidate"] != h["picked"]
    )
    if sum(i["cost_micros"] for i in document["items"]) + unpicked != document["total_cost_micros"]:
        add("ledger", "manifest total does not equal the sum of its items and candidates")
    if heroes is None:
        return
    if set(listed) != set(heroes):
        add("picks", f"manifest lists hero videos {sorted(listed)}, the plan {sorted(heroes)}")
        return
    output = {i.idempotency_key: i.output_sha256 for i in items if i.state == ItemState.COMPLETED}
    shipped = {i["idempotency_key"] for i in document["items"]}
    for video, candidates in heroes.items():
        entry = listed[video]
        if picks.get(video) is not None and entry["picked"] != picks[video]:
            add(
                "picks",
                f"manifest ships {video} candidate {entry['picked']}, the approval "
                f"picked {picks[video]}",
            )
        keys = [c.idempotency_key for c in candidates]
        if [c["idempotency_key"] for c in entry["candidates"]] != keys:
            add("picks", f"manifest's candidates of {video} are not the plan's")
            continue
        for c in entry["candidates"]:
            if output.get(c["idempotency_key"]) != c["sha256"]:
                add(
                    "picks",
                    f"manifest's {video} candidate {c['candidate']} is not the ledger's image",
                )
        picked = keys[entry["picked"] - 1] if 1 <= entry["picked"] <= len(keys) else None
        if picked not in shipped or len(shipped & set(keys)) != 1:
            add("picks", f"manifest does not ship exactly {video}'s picked candidate")


def _planned(
    recorded: tuple[dict[str, Any], list[str]] | None, episode: EpisodeRecord
) -> list[PlannedItem] | None:
    """The items of the episode's newest recorded plan, (playlist, reference hashes) as
    recorded (None: no plan recorded)."""
    if recorded is None:
        return None
    try:
        return planned_items(recorded[0], recorded[1], episode.episode_id, episode.pipeline)
    except InvalidInput as exc:  # recorded by an older version whose rules were looser
        raise _PlanUnreadable(str(exc)) from None


def _label(item: ItemRecord) -> str:
    return item_label(item.video_id, item.part, item.candidate)


class _PlanUnreadable(Exception):
    pass


def legacy_warnings(engine: Engine, pipeline: str, episode_id: str | None = None) -> list[Finding]:
    """Episodes with images or media still in local files from before the media store: a
    warning, not a finding (their files are checked as they are; see `legacy_media`)."""
    return [Finding(e, "legacy-media", d) for e, d in legacy_media(engine, pipeline, episode_id)]
