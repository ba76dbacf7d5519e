"""Use cases behind `episodic plan|generate|retry|runs resume` (and the generate flow)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from episodic.core.dedup import Admission
from episodic.core.errors import CommandNotAllowed, ProviderConfigError, frozen_plan
from episodic.core.hints import hint
from episodic.core.ids import EpisodeId
from episodic.core.money import amount_text
from episodic.core.planning import GenerateRequest, RunOptions, check_budget
from episodic.core.playlist import PlannedItem, Playlist, expand
from episodic.core.runs import PlanReport
from episodic.core.settings import Settings
from episodic.core.states import FROZEN_PLAN_STATES, RunState
from episodic.pipeline.admission import (
    admit_run,
    check_period_budgets,
    dedup_policy,
    options_from_request,
    plan,
    prepare_resume,
    run_request,
)
from episodic.pipeline.gate import CredentialSource, GatePass, build_provider, open_gate
from episodic.pipeline.item_dispatch import ItemExecutor, thread_pool_executor
from episodic.pipeline.media_view import writable_store
from episodic.pipeline.outcomes import RunOutcome, nothing_to_do
from episodic.pipeline.playlists import (
    parse_playlist,
    playlist_sha256,
)
from episodic.pipeline.runner import Runner, mark_generated
from episodic.providers.profiles import Profile, configured_profiles, get_profile
from episodic.storage.admission import AdmissionStore
from episodic.storage.cancels import CancelStore
from episodic.storage.claims import ClaimStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.plans import PlanRecord, PlanStore
from episodic.storage.runs import RunStore


@dataclass(frozen=True, slots=True)
class Prepared:
    gate: GatePass
    items: list[PlannedItem]
    profile: Profile
    plan_id: int | None = None  # the recorded plan the items come from
    reference_image: str | None = None  # sha256 of the plan's reference image
    # the plan with `--hero-candidates N` applied (playlist, reference hashes, N), when it
    # differs from the recorded one: the items come from it, and it is recorded when the run
    # is admitted (`plan_id` is then the plan it was derived from)
    replan: tuple[Playlist, list[str], int] | None = None


def prepare(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    command: str,
    *,
    hero_candidates: int | None = None,
) -> Prepared:
    """The gate first, then the recorded plan and the provider profile. No credential yet.
    `hero_candidates` (`generate --hero-candidates N`): the items of the recorded plan with
    every hero run at N candidates (`Prepared.replan`; nothing is recorded here).
    Errors: `CommandNotAllowed` (no plan), `InvalidInput` (no video can be a hero video)."""
    gate = open_gate(engine, pipeline, episode_id, command)
    recorded = PlanStore(engine).current_plan(gate.episode_pk)
    if recorded is None:
        raise CommandNotAllowed(
            f"episode {gate.episode_id} has no plan: "
            + hint(
                f"run `episodic plan {gate.episode_id} --playlist FILE` first",
                f"run the plan deployment for {gate.episode_id} with a playlist first (or the "
                "weekly deployment, which plans from its playlist parameter)",
            )
        )
    plan_id, playlist, references = recorded
    parsed = parse_playlist(playlist, "recorded plan")  # once: the items and the image
    replan = None
    if hero_candidates is not None:
        changed = parsed.with_hero_candidates(hero_candidates)
        if playlist_sha256(changed) != playlist_sha256(parsed):
            if gate.episode.state in FROZEN_PLAN_STATES:  # as recording it would (--plan too)
                raise frozen_plan(gate.episode_id, str(gate.episode.state))
            parsed, replan = changed, (changed, references, hero_candidates)
    items = expand(parsed, references, gate.episode_id, gate.pipeline)
    profile = get_profile(configured_profiles(settings), parsed.provider_profile)
    reference = parsed.reference_image_sha256(references)
    if (
        reference is not None
        and profile.kind in ("replicate", "fal")
        and profile.reference_image_input is None
    ):
        raise ProviderConfigError(
            f"episode {gate.episode_id}: the plan has a reference image, but provider "
            f"profile {profile.id!r} names no model input for it (reference_image_input)"
        )
    return Prepared(gate, items, profile, plan_id, reference, replan)


def _replan_record(prepared: Prepared) -> PlanRecord | None:
    """The plan `--hero-candidates` changed, to be recorded when the run is admitted."""
    if prepared.replan is None:
        return None
    playlist, references, candidates = prepared.replan
    return PlanRecord(
        playlist.model_dump(mode="json"),
        playlist_sha256(playlist),
        references,
        f"generate --hero-candidates {candidates}",
    )


def build_runner(
    engine: Engine,
    settings: Settings,
    prepared: Prepared,
    credentials: CredentialSource,
    executor: ItemExecutor = thread_pool_executor,
    stop: threading.Event | None = None,
) -> Runner:
    """Build the provider (through the gate) and the runner that works items with it."""
    reference_image = None
    if prepared.reference_image is not None:  # before the credential is read
        found = PlanStore(engine).reference_image(prepared.reference_image)
        if found is None:
            raise CommandNotAllowed(
                f"episode {prepared.gate.episode_id}: its plan's reference image is not "
                "recorded (planned before reference images were kept): plan it again"
            )
        media_type, content = found
        reference_image = f"data:{media_type};base64,{base64.b64encode(content).decode()}"
    media = writable_store(settings, engine)  # fail closed before the credential is read
    provider = build_provider(prepared.gate, prepared.profile, credentials, settings)
    return Runner(
        store=RunStore(engine),
        claims=ClaimStore(engine),
        leases=LeaseStore(engine),
        ledger=LedgerStore(engine),
        plans=PlanStore(engine),
        cancels=CancelStore(engine),
        episodes=EpisodeRepository(engine),
        gate=prepared.gate,
        provider=provider,
        profile=prepared.profile,
        media=media,
        executor=executor,
        stop=stop or threading.Event(),
        planned_keys=frozenset(item.idempotency_key for item in prepared.items),
        plan_id=prepared.plan_id,
        reference_image=reference_image,
    )


OnStart = Callable[[Runner, str], None]


@dataclass(frozen=True, slots=True)
class Requested:
    """A generate request past the gate, opened once (`open_request`): the request, its
    episode's plan and provider profile (`prepared`), and the run options it asks for."""

    request: GenerateRequest
    prepared: Prepared
    options: RunOptions


def open_request(
    engine: Engine, settings: Settings, pipeline: str, request: GenerateRequest
) -> Requested:
    """The gate and the recorded plan of `request`'s episode (`prepare`), and the request's
    run options read against that plan. No credential yet; nothing is written.
    Errors: as `prepare`, and `InvalidInput` for a selection the plan does not have."""
    prepared = prepare(
        engine,
        settings,
        pipeline,
        request.episode_id,
        "generate",
        hero_candidates=request.hero_candidates,
    )
    return Requested(request, prepared, options_from_request(settings, prepared.items, request))


def generate(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    options: RunOptions,
    credentials: CredentialSource,
    *,
    idempotency_key: str | None = None,
    batch_id: str | None = None,
    allow_duplicate: bool = False,
    executor: ItemExecutor = thread_pool_executor,
    on_start: OnStart | None = None,
    hero_candidates: int | None = None,
) -> RunOutcome:
    """A generate whose run options are given outright (a retry's recorded ones, a buy-again's,
    a Python caller's): the request is built once from the other arguments (refused as
    `GenerateRequest` refuses), the gate opened once, and the rest is `generate_requested`."""
    request = GenerateRequest(
        episode_id,
        concurrency=options.concurrency,
        max_retries=options.max_retries,
        max_images=options.max_images,
        max_cost=None if options.max_cost_micros is None else amount_text(options.max_cost_micros),
        force_resubmit=options.force_resubmit,
        hero_candidates=hero_candidates,
        idempotency_key=idempotency_key,
        batch_id=batch_id,
        allow_duplicate=allow_duplicate,
    )
    prepared = prepare(
        engine, settings, pipeline, episode_id, "generate", hero_candidates=hero_candidates
    )
    requested = Requested(request, prepared, options)
    return generate_requested(
        engine, settings, requested, credentials, executor=executor, on_start=on_start
    )


def generate_requested(
    engine: Engine,
    settings: Settings,
    requested: Requested,
    credentials: CredentialSource,
    *,
    executor: ItemExecutor = thread_pool_executor,
    on_start: OnStart | None = None,
) -> RunOutcome:
    """The Python API of `episodic generate` (the CLI and the Prefect flow call it), for a
    request whose gate `open_request` opened.

    In this order, so that a refused request writes nothing: the gate (id, episode) and the
    recorded plan (`open_request`), the budget guard, the credential (provider built), and
    only then the choke point `admit_run`, which reuses an active run of the same request
    (``outcome.deduplicated``) or creates one. `on_start(runner, run_id)` is called before
    the run executes (progress displays). Errors: `InvalidInput` and its kin (exit 2),
    `EpisodeNotFound` (5), `ProviderConfigError` (2), `IdempotencyKeyReused` (2).
    The request's `hero_candidates`: every hero run of the plan at N candidates; the changed
    plan is recorded once the budget guard passed (refused for an approved episode: frozen
    plan).
    """
    request, prepared, options = requested.request, requested.prepared, requested.options
    if options.cap_micros is None:
        options = replace(options, cap_micros=settings.max_run_cost_micros)
    dedup = run_request(
        prepared.gate,
        prepared.items,
        options,
        prepared.profile,
        idempotency_key=request.idempotency_key,
        batch_id=request.batch_id,
        allow_duplicate=request.allow_duplicate,
    )
    store = RunStore(engine)
    report = plan(PlanStore(engine), prepared.gate, prepared.items, options, prepared.profile)
    check_budget(report, options)
    check_period_budgets(engine, prepared.gate.pipeline, report)
    # Nothing to submit, collect or reconcile: no provider (no credential read, no store
    # probe). A live run of the same request that admission joins still gets one below.
    run = (
        build_runner(engine, settings, prepared, credentials, executor) if report.has_work else None
    )
    admission = admit_run(  # records a --hero-candidates plan once nothing can refuse it
        AdmissionStore(engine),
        prepared.gate,
        prepared.items,
        report,
        options,
        prepared.profile,
        dedup,
        dedup_policy(settings),
        plan_id=prepared.plan_id,
        replan=_replan_record(prepared),
    )
    if admission.run_id is None:
        outcome = nothing_to_do(prepared.gate, report, options)
        if outcome.state == RunState.COMPLETED:  # an allocated episode only: a decision stands
            _mark_generated(engine, prepared, None, admission.plan_id)
            outcome = _with_decision(engine, prepared.gate, outcome)
        return outcome
    if run is None:  # joined a live run of the same request: it needs this process's provider
        run = build_runner(engine, settings, prepared, credentials, executor)
    run.plan_id = admission.plan_id  # the plan it runs (the new one after a replan)
    return _execute_admitted(store, run, admission.run_id, admission, options, report, on_start)


def _execute_admitted(
    store: RunStore,
    run: Runner,
    run_id: str,
    admission: Admission,
    options: RunOptions,
    report: PlanReport,
    on_start: OnStart | None,
) -> RunOutcome:
    """The admitted run `run_id` executes here (`on_start` first); one this call created
    (`admission`) that is interrupted before it starts is abandoned, so no pending row is
    left behind."""
    try:
        if on_start is not None:
            on_start(run, run_id)
        return run.execute(run_id, options, report.skipped, deduplicated=admission.deduplicated)
    except BaseException:
        if admission.created:  # interrupted before the run started: no ghost pending row
            store.abandon_pending(run_id, "interrupted before it started")
        raise


def resume(
    engine: Engine,
    settings: Settings,
    run_id: str,
    credentials: CredentialSource,
    *,
    force_resubmit: bool = False,
    executor: ItemExecutor = thread_pool_executor,
    on_start: OnStart | None = None,
    episode_id: str | None = None,
    pipeline: str | None = None,
    max_images: int | None = None,
    max_cost_micros: int | None = None,
) -> RunOutcome:
    """The Python API of `episodic runs resume` / `retry`: finish a paused or failed run,
    join a live one (``deduplicated``), or take over one whose process died (lease expired).
    A completed run answers at once. `episode_id` and `pipeline`: the episode the caller
    named (`generate E --resume RUN`); a run of another episode is refused before anything
    is read.
    Errors: `RunNotFound` (5), `InvalidInput` (2, a malformed `episode_id`),
    `CommandNotAllowed` (2)."""
    store = RunStore(engine)
    stored = store.get_run(run_id)
    if episode_id is not None:
        named = str(EpisodeId.parse(episode_id))
        if (stored.episode_id, stored.pipeline) != (named, pipeline or stored.pipeline):
            raise CommandNotAllowed(
                f"run {run_id} belongs to episode {stored.episode_id} of pipeline "
                f"{stored.pipeline!r}, not {named} of {pipeline or stored.pipeline!r}; "
                "nothing was done"
            )
    prepared = prepare(engine, settings, stored.pipeline, stored.episode_id, "resume")
    if stored.state == RunState.COMPLETED:
        return _already_completed(store, prepared, run_id)
    if stored.plan_id is not None and stored.plan_id != prepared.plan_id:
        raise CommandNotAllowed(
            f"run {run_id} was for an earlier plan of episode {stored.episode_id} (it was "
            "re-planned since); it is not resumed, and nothing was spent: "
            + hint(
                f"`episodic generate {stored.episode_id}` generates the current plan",
                f"run the generate deployment for {stored.episode_id}",
            )
        )
    # as recorded, with the per-run cap as configured now and the operator's new limits
    options = RunOptions.from_params(stored.params, settings.max_run_cost_micros)
    options = options.with_limits(max_images, max_cost_micros, force_resubmit=force_resubmit)
    run = build_runner(engine, settings, prepared, credentials, executor)
    admission = prepare_resume(store, AdmissionStore(engine), run_id, dedup_policy(settings))
    if on_start is not None:
        on_start(run, run_id)
    return run.execute(run_id, options, 0, joined_live=admission.deduplicated)


def retry(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    credentials: CredentialSource,
    *,
    force_resubmit: bool = False,
    executor: ItemExecutor = thread_pool_executor,
    on_start: OnStart | None = None,
) -> RunOutcome:
    """The Python API of `episodic retry`: resume the episode's latest generation run; if it
    was cancelled, or was for an earlier plan (the episode was re-planned since), ask again
    for the same request on the current plan (a new run through the choke point, which
    collects accepted jobs and reconciles unknowns at no cost).
    Errors: `CommandNotAllowed` (no generation run yet: exit 2), `EpisodeNotFound` (5)."""
    gate = open_gate(engine, pipeline, episode_id, "retry")
    store = RunStore(engine)
    run_id = store.latest_run(gate.episode_pk, "generate")
    if run_id is None:
        raise CommandNotAllowed(f"episode {gate.episode_id} has no generation run to retry")
    latest = store.get_run(run_id)
    current = PlanStore(engine).current_plan(gate.episode_pk)
    replanned = latest.plan_id is not None and (current is None or latest.plan_id != current[0])
    if latest.state != RunState.CANCELLED and not replanned:
        return resume(
            engine,
            settings,
            run_id,
            credentials,
            force_resubmit=force_resubmit,
            executor=executor,
            on_start=on_start,
        )
    options = replace(RunOptions.from_params(latest.params), force_resubmit=force_resubmit)
    return generate(
        engine,
        settings,
        pipeline,
        gate.episode_id,
        options,
        credentials,
        idempotency_key=None,
        batch_id=latest.batch_id,
        executor=executor,
        on_start=on_start,
    )


def _already_completed(store: RunStore, prepared: Prepared, run_id: str) -> RunOutcome:
    """A completed run answers at once, and the episode is marked generated if a crash
    came between the run's completion and that step (credential-free)."""
    from episodic.core.exit_codes import ExitCode

    _mark_generated(store.engine, prepared, run_id, prepared.plan_id)
    counts = store.counts(run_id)
    message = f"run {run_id} already completed; nothing to resume"
    outcome = RunOutcome(run_id, RunState.COMPLETED, ExitCode.OK, counts, 0, message)
    return _with_decision(store.engine, prepared.gate, outcome)


def _mark_generated(
    engine: Engine, prepared: Prepared, run_id: str | None, plan_id: int | None
) -> None:
    """`runner.mark_generated` without a runner (nothing was bought here)."""
    keys = frozenset(item.idempotency_key for item in prepared.items)
    mark_generated(EpisodeRepository(engine), prepared.gate.episode_pk, keys, run_id, plan_id)


def _with_decision(engine: Engine, gate: GatePass, outcome: RunOutcome) -> RunOutcome:
    """A generate that had nothing to do on a rejected episode says that the rejection
    stands (who, when, why) and how to undo it, instead of leaving the reader to think the
    episode now waits for a decision."""
    from episodic.pipeline.approval import rejection_note

    note = rejection_note(engine, gate.episode_pk, gate.episode_id)
    return outcome if note is None else replace(outcome, message=f"{outcome.message}; {note}")
