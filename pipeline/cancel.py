"""Cancelling a run: the run stops before its next paid call, and the jobs the provider
accepted for it and nobody collected are cancelled at the provider where its API allows,
except a job whose item another live run (pending, running, paused) includes: that run
collects it, and a cancelled job would make it pay for the item again (Replicate bills a
cancelled prediction).

Each cancel asked is recorded in the ledger (an episode event ``provider_cancel`` with the
submission, the remote reference and the provider's answer). The submissions stay
``accepted``: a cancelled job may still finish, and a later run collects it, or records its
failure, at no new cost; but a job the provider answers has ended without an output
(``canceled``, ``failed``) whose price does not bill such jobs (`Profile.bills_failures`)
is closed failed at once, with no cost, so its reservation stops counting against the caps
and budgets; one whose price bills them (the time it ran: Replicate's hardware-time models,
https://replicate.com/pricing; a ``canceled`` prediction is charged,
https://replicate.com/changelog/2025-10-16-prediction-deadlines, for the time its
``metrics.predict_time`` reports, https://replicate.com/docs/topics/predictions/lifecycle) is
polled once and closed failed at that charge (`_settle_billed`). Cancelling an already
cancelled run asks again for the jobs still accepted (calls that were in flight when the run
was first cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import EpisodicError, InvalidTransition
from episodic.core.settings import Settings
from episodic.core.states import RunState
from episodic.pipeline.gate import CredentialSource, GatePass, build_provider, open_gate
from episodic.pipeline.prices import failure_charge
from episodic.providers.base import CancelsJobs, Provider, ProviderError, RemoteJobFailed
from episodic.providers.profiles import Profile, configured_profiles, get_profile
from episodic.storage.cancels import CancelStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore


@dataclass(frozen=True, slots=True)
class JobCancel:
    submission: int
    remote_ref: str
    profile: str
    answer: str  # the provider's status, or why it was not asked
    kept_for: str | None = None  # the live run that includes the item and collects the job

    @property
    def asked(self) -> bool:
        """The provider answered the cancel (whatever the job's state was)."""
        return self.kept_for is None and not self.answer.startswith(("not asked:", "unknown:"))

    @property
    def missed(self) -> bool:
        """A cancel that should have been asked and was not (a cancel again asks it)."""
        return self.kept_for is None and not self.asked

    def to_dict(self) -> dict[str, Any]:
        return {
            "submission": self.submission,
            "remote_ref": self.remote_ref,
            "profile": self.profile,
            "answer": self.answer,
            "kept_for": self.kept_for,
        }


def cancel_run(
    engine: Engine,
    settings: Settings,
    run_id: str,
    credentials: CredentialSource,
    *,
    settled: frozenset[int] = frozenset(),
) -> tuple[str, list[JobCancel]]:
    """Cancel `run_id` (pending, running, paused, or already cancelled); then ask the
    provider to cancel each accepted, uncollected job of the run (a job whose item another
    live run includes, checked right before that job's call, is kept for it:
    `JobCancel.kept_for`). A run that already ended
    (failed, its jobs left for later collection) keeps its state and its jobs are still
    asked. Jobs whose submission is in `settled` (a cancel already had the provider's
    answer that they stopped) are not asked again. Returns the run's state and one
    `JobCancel` per job asked or kept. Raises `RunNotFound`, `InvalidTransition` (an ended
    run with no accepted job)."""
    store = RunStore(engine)
    ledger = LedgerStore(engine)
    cancels = CancelStore(engine)
    if store.run_state(run_id) != RunState.CANCELLED:
        try:
            store.transition_run(run_id, RunState.CANCELLED, "cancelled by operator")
        except InvalidTransition:
            # a run that ended (failed: its jobs left for later collection) keeps its state,
            # and its accepted jobs are still asked to cancel; with none, nothing to do
            if store.run_state(run_id) != RunState.CANCELLED and not ledger.accepted_jobs(run_id):
                raise
    run = store.get_run(run_id)
    jobs = [job for job in ledger.accepted_jobs(run_id) if job[0] not in settled]
    if not jobs:
        return run.state, []
    gate = open_gate(engine, run.pipeline, run.episode_id, "cancel")
    profiles = configured_profiles(settings)
    answers: list[JobCancel] = []
    providers: dict[str, Provider | str] = {}  # a client, or why it could not be built
    for submission, remote_ref, profile_id in jobs:
        # Decided right before each job's call, and recorded with the decision under the
        # episode's membership lock: a run admitted while earlier jobs were being cancelled
        # (a provider round trip each) may be collecting this one (kept for it), and a run
        # admitted after the decision buys the item anew if it finds this job cancelled.
        keeper = cancels.ask_provider_cancel(run_id, submission, remote_ref, profile_id)
        if keeper is not None:
            answer = f"kept: run {keeper} includes the item and collects this job"
            answers.append(JobCancel(submission, remote_ref, profile_id, answer, keeper))
            continue
        answer = _ask(gate, profiles, profile_id, remote_ref, providers, settings, credentials)
        cancels.record_provider_cancel(run_id, submission, remote_ref, profile_id, answer)
        answers.append(JobCancel(submission, remote_ref, profile_id, answer))
        if _ended_unbilled(profiles, profile_id, answer):
            ledger.close_failed(submission, f"{answer} at the provider on cancel: not billed")
        elif _ended_billed(profiles, profile_id, answer):
            _settle_billed(gate, ledger, submission, remote_ref, profiles[profile_id], providers)
    for provider in providers.values():
        if not isinstance(provider, str):
            provider.close()
    return run.state, answers


def _ask(
    gate: GatePass,
    profiles: dict[str, Profile],
    profile_id: str,
    remote_ref: str,
    providers: dict[str, Provider | str],
    settings: Settings,
    credentials: CredentialSource,
) -> str:
    if profile_id not in providers:
        try:
            profile = get_profile(profiles, profile_id)
            providers[profile_id] = build_provider(gate, profile, credentials, settings)
        except EpisodicError as exc:
            providers[profile_id] = f"not asked: {exc}"[:200]  # said for each of its jobs
    provider = providers[profile_id]
    if isinstance(provider, str):
        return provider
    if not isinstance(provider, CancelsJobs):
        return "not asked: the provider has no cancel"
    try:
        return str(provider.cancel(remote_ref))
    except ProviderError as exc:
        return f"unknown: {exc}"[:200]


ENDED_ANSWERS = frozenset({"canceled", "cancelled", "failed"})
"""The job has ended at the provider without an output (Replicate's terminal statuses)."""


def _ended_unbilled(profiles: dict[str, Profile], profile_id: str, answer: str) -> bool:
    """The provider's answer says the job ended without an output, and its profile's price
    says such a job is not billed (`Profile.bills_failures`): its submission is closed at
    once, with no cost, so its reservation stops counting against the caps and budgets
    although nobody polls it again. A price that bills them (the time a job ran) leaves it
    accepted: the next run collects its charge."""
    profile = profiles.get(profile_id)
    return (
        profile is not None
        and not profile.bills_failures
        and answer.strip().lower() in ENDED_ANSWERS
    )


def _ended_billed(profiles: dict[str, Profile], profile_id: str, answer: str) -> bool:
    """The provider's answer says the job ended without an output, and its profile's price
    bills such a job (the time it ran: Replicate's hardware-time models)."""
    profile = profiles.get(profile_id)
    return (
        profile is not None and profile.bills_failures and answer.strip().lower() in ENDED_ANSWERS
    )


def _settle_billed(
    gate: GatePass,
    ledger: LedgerStore,
    submission: int,
    remote_ref: str,
    profile: Profile,
    providers: dict[str, Provider | str],
) -> None:
    """Poll a job that ended billed once, and close it failed with the charge its reply
    states (`pipeline.prices.failure_charge`: the time it ran), so the ledger holds what the
    provider bills and its reservation stops counting although nobody polls it again.

    One poll, no wait: a reply that is not terminal yet (or no answer) leaves the job
    accepted, and the next run's collect, or a later cancel, records its charge. A poll that
    finds an output (the job finished after all) is left for the next run to collect: it is
    paid, and a cancel stores nothing."""
    provider = providers.get(profile.id)
    if provider is None or isinstance(provider, str):
        return
    try:
        provider.collect(remote_ref, deadline_s=0.0, should_stop=lambda: False)
    except RemoteJobFailed as exc:
        charge = failure_charge(provider.capabilities.price, profile, exc)
        said = "billed" if charge is not None else "not billed"
        ledger.close_failed(
            submission,
            f"{' '.join(str(exc).split())[:200]} at the provider on cancel: {said}",
            episode_pk=gate.episode_pk,
            charge=charge,
        )
    except ProviderError:
        return  # not terminal yet, or no answer: a later collect records it


CANCELLED_ANSWERS = frozenset({"canceled", "cancelled", "cancellation_requested"})
"""A cancel stopped the job (the fake's and Replicate's ``canceled``, fal's
``CANCELLATION_REQUESTED``)."""
FINISHED_ANSWERS = frozenset({"succeeded", "already_completed"})
"""The job had finished before the cancel: billed, and the next run collects it free."""
GONE_ANSWERS = frozenset({"failed", "not_found"})
"""The job failed on its own, or the provider does not know it: nothing runs."""
STOPPED_ANSWERS = CANCELLED_ANSWERS | FINISHED_ANSWERS | GONE_ANSWERS


def stopped(answer: str) -> bool:
    """The provider's answer says the job no longer runs (or never will)."""
    return answer.strip().lower() in STOPPED_ANSWERS


def cancelled_answer(answer: str) -> bool:
    """The provider's answer says a cancel stopped the job."""
    return _is(answer, CANCELLED_ANSWERS)


def _is(answer: str, kinds: frozenset[str]) -> bool:
    return answer.strip().lower() in kinds


@dataclass(frozen=True, slots=True)
class Settlement:
    """What the cancel of one or more runs (a cancelled Prefect flow run's) did with the
    jobs the provider held for them."""

    runs: dict[str, str]  # run id -> its state after the cancel
    episodes: dict[str, str]  # run id -> its episode id
    answers: list[tuple[str, JobCancel]]  # (run id, answer) asked by this settlement
    already: int = 0  # jobs an earlier cancel had settled (not asked again)
    errors: dict[str, str] | None = None  # run id -> why it could not be cancelled

    @property
    def cancelled(self) -> list[JobCancel]:
        return [job for _, job in self.answers if job.asked and _is(job.answer, CANCELLED_ANSWERS)]

    @property
    def finished(self) -> list[JobCancel]:
        """Jobs that had finished at the provider before the cancel reached them (billed)."""
        return [job for _, job in self.answers if job.asked and _is(job.answer, FINISHED_ANSWERS)]

    @property
    def kept(self) -> list[JobCancel]:
        return [job for _, job in self.answers if job.kept_for is not None]

    @property
    def billing(self) -> list[tuple[str, JobCancel]]:
        """Jobs that may still run and bill: not kept for another run, and the provider did
        not say they stopped (no cancel in its API, an unknown answer, still running)."""
        return [
            (run, job)
            for run, job in self.answers
            if job.kept_for is None and not (job.asked and stopped(job.answer))
        ]

    def lines(self) -> list[str]:
        """The settlement in words: what was cancelled, what still bills, and the one
        command that settles it (or that finishes the episode)."""
        out: list[str] = []
        for run_id, state in self.runs.items():
            out.append(f"run {run_id} of episode {self.episodes[run_id]} is {state}")
        for run_id, why in (self.errors or {}).items():
            out.append(f"run {run_id} could not be cancelled: {why}")
        if self.cancelled:
            refs = ", ".join(job.remote_ref for job in self.cancelled)
            more = f" (and {self.already} by an earlier cancel)" if self.already else ""
            out.append(f"cancelled at the provider: {len(self.cancelled)} jobs{more}: {refs}")
        elif self.already:
            out.append(
                f"cancelled at the provider: {self.already} jobs, by an earlier cancel of "
                "this run (not asked again)"
            )
        else:
            out.append("cancelled at the provider: none (no accepted job was left to cancel)")
        if self.finished:
            out.append(
                f"finished before the cancel: {len(self.finished)} jobs (billed; the next run "
                "of the episode collects them at no new cost)"
            )
        for job in self.kept:
            out.append(f"kept: job {job.remote_ref}: {job.answer}")
        billing = self.billing
        if billing:
            first = billing[0][0]
            out.append(
                f"still billing: {len(billing)} jobs the provider did not confirm stopped "
                f"({billing[0][1].answer}); settle with: episodic runs cancel {first} "
                "(asks the provider again and records each answer)"
            )
        else:
            out.append("still billing: none (nothing was bought after the cancel)")
            for run_id, episode_id in sorted(set(self.episodes.items()), key=lambda e: e[1]):
                if self.runs.get(run_id) == RunState.CANCELLED:
                    out.append(
                        f"to finish episode {episode_id} later: episodic generate {episode_id} "
                        "(or run the generate deployment for it): completed images are kept, "
                        "cancelled ones are bought anew"
                    )
                    break
        return out


def settle_cancelled(
    engine: Engine, settings: Settings, run_ids: list[str], credentials: CredentialSource
) -> Settlement:
    """Cancel each of `run_ids` (the runs a cancelled flow run worked on) as `cancel_run`
    does, asking the provider only for the jobs no earlier cancel saw stop: a flow's own
    SIGTERM path and the worker's cancellation hook both settle, and the provider is asked
    once per job that still runs. A completed run is left as it is."""
    store = RunStore(engine)
    episodes_store = EpisodeRepository(engine)
    cancels = CancelStore(engine)
    ledger = LedgerStore(engine)
    states: dict[str, str] = {}
    episodes: dict[str, str] = {}
    answers: list[tuple[str, JobCancel]] = []
    errors: dict[str, str] = {}
    already = 0
    for run_id in dict.fromkeys(run_ids):
        run = store.get_run(run_id)
        episodes[run_id] = run.episode_id
        if run.state == RunState.COMPLETED:
            states[run_id] = run.state
            continue
        episode_pk = episodes_store.episode_pk(run.pipeline, run.episode_id)
        answered = cancels.provider_cancel_answers(episode_pk)
        settled = frozenset(pk for pk, answer in answered.items() if stopped(answer))
        already += sum(1 for job in ledger.accepted_jobs(run_id) if job[0] in settled)
        try:
            state, jobs = cancel_run(engine, settings, run_id, credentials, settled=settled)
        except InvalidTransition as exc:
            states[run_id] = store.run_state(run_id)
            errors[run_id] = str(exc)
            continue
        states[run_id] = state
        answers.extend((run_id, job) for job in jobs)
    return Settlement(states, episodes, answers, already, errors or None)
