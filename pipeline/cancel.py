"""Cancelling a run: the run stops before its next paid call, and the jobs the provider
accepted for it and nobody collected are cancelled at the provider where its API allows,
except a job whose item another live run (pending, running, paused) includes: that run
collects it, and a cancelled job would make it pay for the item again (Replicate bills a
cancelled prediction).

Each cancel asked is recorded in the ledger (an episode event ``provider_cancel`` with the
submission, the remote reference and the provider's answer). The submissions stay
``accepted``: a cancelled job may still finish, and a later run collects it, or records its
failure, at no new cost. Cancelling an already cancelled run asks again for the jobs still
accepted (calls that were in flight when the run was first cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from core.errors import EpisodicError, InvalidTransition
from core.settings import Settings
from core.states import RunState
from pipeline.gate import CredentialSource, build_provider, open_gate
from providers.base import ProviderError
from providers.profiles import get_profile, load_profiles
from storage.runs import RunStore


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
    engine: Engine, settings: Settings, run_id: str, credentials: CredentialSource
) -> tuple[str, list[JobCancel]]:
    """Cancel `run_id` (pending, running, paused, or already cancelled); then ask the
    provider to cancel each accepted, uncollected job of the run (a job whose item another
    live run includes, checked right before that job's call, is kept for it:
    `JobCancel.kept_for`). A run that already ended
    (failed, its jobs left for later collection) keeps its state and its jobs are still
    asked. Returns the run's state and one `JobCancel` per job. Raises `RunNotFound`,
    `InvalidTransition` (an ended run with no accepted job)."""
    store = RunStore(engine)
    if store.run_state(run_id) != RunState.CANCELLED:
        try:
            store.transition_run(run_id, RunState.CANCELLED, "cancelled by operator")
        except InvalidTransition:
            # a run that ended (failed: its jobs left for later collection) keeps its state,
            # and its accepted jobs are still asked to cancel; with none, nothing to do
            if store.run_state(run_id) != RunState.CANCELLED and not store.accepted_jobs(run_id):
                raise
    run = store.get_run(run_id)
    jobs = store.accepted_jobs(run_id)
    if not jobs:
        return run.state, []
    gate = open_gate(engine, run.pipeline, run.episode_id, "cancel")
    profiles = load_profiles(settings.providers_path)
    answers: list[JobCancel] = []
    providers: dict[str, Any] = {}
    for submission, remote_ref, profile_id in jobs:
        # Decided right before each job's call, and recorded with the decision under the
        # episode's membership lock: a run admitted while earlier jobs were being cancelled
        # (a provider round trip each) may be collecting this one (kept for it), and a run
        # admitted after the decision buys the item anew if it finds this job cancelled.
        keeper = store.ask_provider_cancel(run_id, submission, remote_ref, profile_id)
        if keeper is not None:
            answer = f"kept: run {keeper} includes the item and collects this job"
            answers.append(JobCancel(submission, remote_ref, profile_id, answer, keeper))
            continue
        answer = _ask(gate, profiles, profile_id, remote_ref, providers, settings, credentials)
        store.record_provider_cancel(run_id, submission, remote_ref, profile_id, answer)
        answers.append(JobCancel(submission, remote_ref, profile_id, answer))
    for provider in providers.values():
        if not isinstance(provider, str):
            provider.close()
    return run.state, answers


def _ask(
    gate: Any,
    profiles: dict[str, Any],
    profile_id: str,
    remote_ref: str,
    providers: dict[str, Any],
    settings: Settings,
    credentials: CredentialSource,
) -> str:
    if profile_id not in providers:
        try:
            profile = get_profile(profiles, profile_id)
            providers[profile_id] = build_provider(gate, profile, credentials, settings.home_path)
        except EpisodicError as exc:
            providers[profile_id] = f"not asked: {exc}"[:200]  # said for each of its jobs
    provider = providers[profile_id]
    if isinstance(provider, str):
        return provider
    cancel = getattr(provider, "cancel", None)
    if not callable(cancel):
        return "not asked: the provider has no cancel"
    try:
        return str(cancel(remote_ref))
    except ProviderError as exc:
        return f"unknown: {exc}"[:200]
