"""`episodic runs adopt RUN ITEM --job ID`: record a job an operator found at the provider as
the item's paid call whose acceptance is unknown, after proving it is that call's job.

A create whose reply was lost may have made a job that no lookup can settle (fal lists
nothing; Replicate without ``lookup_by_input``; an ambiguity the ledger cannot break). The
operator finds it (docs/providers.md says where) and names it; this command

1. refuses (`InvalidInput`, exit 2, one line) unless the item's latest paid call is
   unsettled (intent or unknown): an item with an accepted or finished call has its job;
2. refuses a job the ledger records for any other paid call (another item, another
   episode, an earlier attempt): one job is never two items' images;
3. verifies the job at the provider without spending (`VerifiesJobs.verify_job`: the model,
   and the item's input as far as the provider shows it) and refuses one that is not the
   item's, or that cannot be verified (`NotOurJob`);
4. records it as the call's accepted job (`LedgerStore.accept`: only while the call is still
   unsettled, and only if no other call records the job, in one transaction).

It sends no create: nothing is paid. The run's next `runs resume` collects the job (an
accepted job is collected, free) and completes the item with the job's charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import EpisodicError, InvalidInput, ProviderConfigError
from episodic.core.states import ItemState, SubmissionState
from episodic.pipeline.gate import CredentialSource
from episodic.providers.adapters import build_client
from episodic.providers.base import ImageRequest, NotOurJob, ProviderError, VerifiesJobs
from episodic.providers.profiles import Profile
from episodic.storage.adoption import latest_submission, recorded_for
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore


class NoAnswer(EpisodicError):
    """The provider did not answer the verification (exit 1): nothing was recorded."""


@dataclass(frozen=True, slots=True)
class Adopted:
    run_id: str
    item_id: str
    job: str
    profile: str
    verified: str  # what the provider's reply proved

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "item_id": self.item_id,
            "job": self.job,
            "profile": self.profile,
            "verified": self.verified,
            "paid_calls": 0,
        }


def adopt_job(
    engine: Engine,
    profiles: dict[str, Profile],
    state_dir: Path,
    run_id: str,
    item_id: str,
    job: str,
    credentials: CredentialSource,
) -> Adopted:
    """Record `job` as the accepted job of `item_id`'s unsettled paid call in `run_id`, once
    the provider shows it is that call's (module docstring). Raises `InvalidInput` (exit 2),
    `ProviderConfigError` (exit 2), `NoAnswer` (exit 1)."""
    job = job.strip()
    store = RunStore(engine)
    run = store.get_run(run_id)
    items = store.run_items(run_id)
    item = next((i for i in items if i.item_id == item_id), None)
    if item is None:
        known = ", ".join(i.item_id for i in items[:8]) + (", ..." if len(items) > 8 else "")
        raise InvalidInput(f"run {run_id} has no item {item_id!r} (its items: {known or 'none'})")
    ledger = LedgerStore(engine)
    latest = latest_submission(engine, item.pk)
    if item.state == ItemState.COMPLETED:
        raise InvalidInput(f"item {item_id} of run {run_id} is completed: it has its image")
    if latest is None or latest[0].state not in (SubmissionState.INTENT, SubmissionState.UNKNOWN):
        has = (
            f"its paid call has job {latest[0].remote_ref} ({latest[0].state})"
            if latest is not None and latest[0].remote_ref
            else "it has no paid call whose outcome is unknown"
        )
        raise InvalidInput(f"item {item_id} of run {run_id}: nothing to adopt: {has}")
    submission, profile_id = latest
    if item.state == ItemState.RUNNING:
        raise InvalidInput(
            f"item {item_id} is being worked on by a run now; adopt once that run stopped"
        )
    if ledger.recorded_elsewhere(job, submission.pk):
        owner = recorded_for(engine, job)
        whose = f"item {owner[1]} of {owner[0]}" if owner else "another paid call"
        raise InvalidInput(
            f"job {job[:80]} is recorded in the ledger for {whose}: never adopted for "
            f"item {item_id}"
        )
    profile = profiles.get(profile_id)
    if profile is None:
        raise ProviderConfigError(
            f"provider profile {profile_id!r} of item {item_id}'s paid call is not configured"
        )
    request = ImageRequest(
        submission.client_reference,
        run.episode_id,
        item.item_id,
        item.prompt,
        item.seed,
    )
    token = credentials.read(profile) if profile.needs_credential else None
    client = build_client(profile, token, state_dir)
    try:
        if not isinstance(client, VerifiesJobs):
            raise InvalidInput(
                f"a {profile.kind} profile cannot verify a job by its id: nothing adopted"
            )
        verified = client.verify_job(job, request)
    except NotOurJob as exc:
        raise InvalidInput(f"not adopted: {exc}") from None
    except ProviderError as exc:
        raise NoAnswer(f"not adopted: the provider did not answer: {exc}") from None
    finally:
        client.close()
    if not ledger.accept(submission.pk, job):
        raise InvalidInput(
            f"not adopted: item {item_id}'s paid call was settled meanwhile, or job "
            f"{job[:80]} is now recorded for another paid call"
        )
    return Adopted(run_id, item_id, job, profile.id, verified)
