"""The one place a provider is called: one claimed item, taken as far as it goes, never paid
for twice.

A claim says what its holder does next (`episodic.core.records.ClaimAction`):

- **submit**: the claim committed the intent of a paid call. Right before the call the
  claim is checked (`PaidCall.holds`); then the call is sent. Only what provably created
  nothing (never sent, 429) is sent again, with backoff, each try after a check. An answer
  whose acceptance is unknown is *resolved* without a new paid call as far as the
  provider's promises go (a lookup by our client reference, or the same create again when
  the provider honours idempotent creates: `episodic.pipeline.resolve`); otherwise the item is
  released as unknown. A create the provider throttled is waited out with every worker of
  the profile, or, past the bound, withdrawn (nothing paid), its item put back pending and
  the run paused (`episodic.pipeline.throttle`); a further attempt (a re-buy, --force-resubmit)
  waits for the profile's recorded throttle the same way before its intent is made.
- **collect**: an accepted job is collected (polled, downloaded), free.
- **reconcile**: an intent or unknown from before is resolved the same way; resubmitted
  only on the operator's `--force-resubmit`.

An accepted job is collected until the provider says it failed, and completed only once
its image is durable (`_collect`): the download is proven to be an image (downloaded again,
free, up to `DOWNLOAD_ATTEMPTS` times in all; still not an image, the submission closes
failed with the provider's charge and the item fails), written to the media store under its
content key and verified there, and only then is the item completed. A store that cannot
take it (an outage, a full disk, a crash before the ledger write) leaves the submission
accepted and the item given back: the next run collects the same job at no cost. The first
such failure also pauses the run (`PaidCall.stop_buying`): it buys nothing more while the
store cannot keep what it buys. A job
cancelled at the
provider by the cancel of another run (one that decided before this run included the item)
is bought again (`PaidCall.buy_again`) only within the item's attempts and the run's budget.
An accepted job whose output the provider proves deleted (`OutputGone`) is closed failed
with its charge and recorded lost at once (`episodic.pipeline.gone`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from episodic.core.errors import InvalidTransition, MediaStoreError, NotAnImage
from episodic.core.media import ProvenImage
from episodic.core.planning import RunOptions, budget_breach
from episodic.core.pricing import Charge, Reservation
from episodic.core.records import ClaimAction, ItemResult
from episodic.core.runs import (
    BUDGET_STOPPED,
    INTERRUPTED,
    STORE_STOPPED,
    Claim,
    Refusal,
    Submission,
)
from episodic.core.states import RunState
from episodic.pipeline.gate import GatePass
from episodic.pipeline.gone import LostAtProvider, record_gone
from episodic.pipeline.media import keep_image, prove_image
from episodic.pipeline.prices import above_price, failure_charge
from episodic.pipeline.resolve import reason, resolve
from episodic.pipeline.throttle import Throttled, send, wait_until
from episodic.pipeline.unknowns import unknown_text
from episodic.providers.base import (
    CollectionPending,
    ImageRequest,
    NotCreated,
    OutputGone,
    Provider,
    RemoteJobFailed,
    Stopped,
    UnknownOutcome,
)
from episodic.providers.profiles import Profile
from episodic.storage.budgets import Guard
from episodic.storage.cancels import CancelStore
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.media import MediaStore
from episodic.storage.runs import RunStore
from episodic.storage.throttles import ThrottleStore

# A claim proved (ours, live, run running) by its own transaction less than this long ago
# needs no second check before its paid call (`PaidCall.holds`).
CLAIM_PROOF_FRESH_S = 0.25
# Downloads of one accepted job, in all, before bytes that are not an image fail the item
# (collecting an accepted job is free; a CDN's error page is often gone on the next try).
DOWNLOAD_ATTEMPTS = 3


class _NotStored(Exception):
    """The provider's image could not be made durable in the media store; its job stays
    accepted and is collected again (free)."""


class _OverBudget(Exception):
    """A re-buy or a forced resubmit would pass a cap or a budget (`episodic.storage.budgets`)."""


class _NotAnImageOutput(Exception):
    """The accepted job's output is still not an image after `DOWNLOAD_ATTEMPTS`."""


@dataclass
class PaidCall:
    """The provider calls of one run in this process, and the ledger writes around them."""

    store: RunStore
    leases: LeaseStore
    ledger: LedgerStore
    cancels: CancelStore
    gate: GatePass
    provider: Provider
    profile: Profile
    media: MediaStore
    stop: threading.Event
    reference_image: str | None = None  # the plan's reference image, a data: URI
    throttles: ThrottleStore | None = None  # the profile's shared throttle (None: this call's)
    price_breach: str | None = None  # the first charge above the price's bound, in words

    def process(self, claim: Claim, options: RunOptions) -> ItemResult:
        """Take one claimed item as far as it goes; returns what happened. Never pays twice."""
        if self.stop.is_set():
            self.withdraw_unsent(claim)
            self.leases.release(claim, INTERRUPTED)
            return ItemResult.INTERRUPTED
        try:
            if claim.action == ClaimAction.SUBMIT:
                assert claim.submission is not None
                found = self._send(claim, claim.submission)
            elif claim.action == ClaimAction.COLLECT:
                assert claim.submission is not None and claim.submission.remote_ref
                found = (claim.submission.pk, claim.submission.remote_ref)
            else:
                found = self._reconcile(claim, options)
            if found is None:
                return ItemResult.UNKNOWN
            try:
                return self._collect(claim, found[0], found[1], options)
            except RemoteJobFailed as exc:
                if not self.buy_again(claim, found[0], exc, options):
                    raise
            # The job was cancelled on an operator's command, by the cancel of another run
            # that decided before this run included the item (`CancelStore.ask_provider_cancel`;
            # its cost is recorded): this run buys the item anew instead of failing it.
            fresh = self._new_attempt(claim, options, forced=False)
            found = self._send(claim, fresh)
            if found is None:
                return ItemResult.UNKNOWN
            return self._collect(claim, found[0], found[1], options)
        except Stopped:
            self.leases.release(claim, INTERRUPTED)
            return ItemResult.INTERRUPTED
        except CollectionPending as exc:
            self.leases.release(
                claim,
                f"accepted job not collected yet ({reason(exc)}); a resume collects it at no cost",
            )
            return ItemResult.COLLECT_LATER
        except _NotStored as exc:
            self.leases.release(
                claim,
                f"accepted job's image not stored yet ({exc}); a resume collects it at no cost",
            )
            self.stop_buying(claim.run_id, str(exc))
            return ItemResult.NOT_STORED
        except (_NotAnImageOutput, LostAtProvider) as exc:
            self.leases.release(claim, str(exc))
            return ItemResult.FAILED
        except Throttled as exc:  # nothing sent: the run pauses, in every process; the item
            # did not fail (its intent was withdrawn): it is still to buy, as before its claim
            self.leases.put_back(claim, f"not bought yet: {exc}")
            self.stop_buying(claim.run_id, str(exc), exc.flavour)
            return ItemResult.THROTTLED
        except _OverBudget as exc:  # nothing sent: the run stops buying, in every process
            self.leases.release(claim, f"not bought: {exc}")
            self.stop_buying(claim.run_id, str(exc), BUDGET_STOPPED)
            return ItemResult.FAILED
        except RemoteJobFailed as exc:
            self.leases.release(claim, f"remote job failed: {reason(exc)}")
            return ItemResult.FAILED
        except NotCreated as exc:
            self.leases.release(claim, reason(exc))
            return ItemResult.FAILED
        except Exception as exc:  # a bug or an outage must not leave the item "running"
            self.leases.release(claim, f"error: {reason(exc)}")
            raise

    def stop_buying(self, run_id: str, why: str, flavour: str = STORE_STOPPED) -> None:
        """The store could not take a paid image: the run is paused with the reason
        (`STORE_STOPPED`), so no process of it claims another item (each is refused at its
        next claim or heartbeat) until `runs resume` or the next generate; what is accepted
        stays accepted and is collected then, at no cost. Each further image bought now
        would be one more the store cannot take (a deleted bucket, revoked credentials)."""
        with suppress(InvalidTransition):  # cancelled or paused meanwhile: it stays so
            self.store.transition_run(run_id, RunState.PAUSED, f"{flavour} {why}"[:2000])

    def buy_again(
        self, claim: Claim, submission_pk: int, exc: RemoteJobFailed, options: RunOptions
    ) -> bool:
        """Whether the item whose job `exc` ended is bought anew in this run: only when the
        provider says the job was cancelled, the cancel of another run asked for exactly
        that (`CancelStore.cancel_asked_elsewhere`: decided before this run included the item),
        the item has an attempt left (--max-retries) and the run's budget (`budget_breach`)
        holds one more call with every open item of the run still to buy. Otherwise the
        item fails, and the operator decides."""
        if not exc.cancelled:  # failed at the provider, or cancelled by this run's own cancel
            return False
        if not self.cancels.cancel_asked_elsewhere(
            self.gate.episode_pk, submission_pk, claim.run_id
        ):
            return False
        used = claim.item.attempts + (1 if claim.action == ClaimAction.SUBMIT else 0)
        if used >= options.max_attempts:
            return False
        counts = self.store.counts(claim.run_id)
        still_open = counts.pending + counts.running  # this item among them
        price = self.reservation.micros
        calls = counts.paid_submissions + still_open
        return budget_breach(calls, counts.cost_micros + price * still_open, options) is None

    def guard(self, run_id: str, options: RunOptions) -> Guard:
        """What every new paid call of the run is held against (`episodic.storage.budgets`)."""
        limits, window = options.limits, self.profile.max_job_s
        return Guard(run_id, self.gate.pipeline, limits, self.reservation, self.profile.id, window)

    def _new_attempt(self, claim: Claim, options: RunOptions, *, forced: bool) -> Submission:
        """A further paid call's intent (a re-buy, --force-resubmit), within the caps and
        budgets; `Stopped` when the run stopped or the claim was lost, `_OverBudget`."""
        waited = 0.0
        while True:
            fresh = self.leases.new_attempt(
                claim,
                self.profile.id,
                forced=forced,
                reserve=self.reservation,
                guard=self.guard(claim.run_id, options),
            )
            if not (isinstance(fresh, Refusal) and fresh.until is not None):
                break
            # the provider throttles the profile (any worker heard it): the call waits for
            # its moment as a claim's does, or the run pauses past the bound (`Throttled`)
            held = None if self.throttles is None else self.throttles.holding(self.profile.id)
            said = held[1] if held is not None else "throttled"
            waited += wait_until(fresh.until, said, waited, self.stop, self.profile.id)
        if isinstance(fresh, Refusal):
            raise _OverBudget(fresh.detail or "a cap or budget")
        if fresh is None:  # the run stopped or the claim was lost: spend nothing
            raise Stopped()
        return fresh

    @property
    def reservation(self) -> Reservation:
        """What each new paid call of this run is reserved at (the price's estimate)."""
        return self.provider.capabilities.price.reservation

    def withdraw_unsent(self, claim: Claim) -> None:
        """A claim's fresh intent whose call was never made goes away (attempt given back)."""
        if claim.action == ClaimAction.SUBMIT and claim.submission is not None:
            self.ledger.withdraw(claim, claim.submission)

    def request(self, claim: Claim, submission: Submission) -> ImageRequest:
        """What the provider is asked for `submission` of `claim`'s item."""
        item = claim.item
        return ImageRequest(
            submission.client_reference,
            self.gate.episode_id,
            item.item_id,
            item.prompt,
            item.seed,
            self.reference_image,
        )

    def _send(self, claim: Claim, submission: Submission) -> tuple[int, str] | None:
        """The paid call of an intent. None: acceptance unknown (item released, explained)."""
        request = self.request(claim, submission)
        if not self.holds(claim):  # cancelled, paused or taken over: no call
            self.ledger.withdraw(claim, submission)
            raise Stopped()
        try:
            remote_ref: str = self._retry_not_created(claim, lambda: self.provider.submit(request))
        except (Stopped, Throttled):  # between tries that provably created nothing
            self.ledger.withdraw(claim, submission)
            raise
        except UnknownOutcome as exc:
            self.ledger.mark_unknown(submission.pk, reason(exc))
            found, looked = self._resolve(claim, submission, request)
            if found is None:
                why = reason(exc) + (f"; {looked}" if looked else "")
                self.leases.release(claim, self._unknown_text(claim, submission, why))
                return None
            return submission.pk, found
        except NotCreated as exc:
            self.ledger.refuse(claim, submission.pk, reason(exc))
            raise
        if not self.ledger.accept(submission.pk, remote_ref):
            self.ledger.mark_unknown(submission.pk, "provider answered with a job already recorded")
            self.leases.release(
                claim, "provider answered with a job recorded for another submission"
            )
            return None
        return submission.pk, remote_ref

    def _reconcile(self, claim: Claim, options: RunOptions) -> tuple[int, str] | None:
        """An intent or unknown from before: ask the provider; resubmit only when forced."""
        submission = claim.submission
        assert submission is not None
        found, looked = self._resolve(claim, submission, self.request(claim, submission))
        if found is not None:
            return submission.pk, found
        if not options.force_resubmit:
            self.ledger.mark_unknown(submission.pk, "acceptance unknown")
            why = "no reply recorded" + (f"; {looked}" if looked else "")
            self.leases.release(claim, self._unknown_text(claim, submission, why))
            return None
        if not self.ledger.refuse(claim, submission.pk, "abandoned by operator (--force-resubmit)"):
            raise Stopped()  # taken over (or settled meanwhile): the new holder decides
        return self._send(claim, self._new_attempt(claim, options, forced=True))

    def _resolve(
        self, claim: Claim, submission: Submission, request: ImageRequest
    ) -> tuple[str | None, str]:
        """Settle an unknown without a new paid call (`episodic.pipeline.resolve`)."""
        return resolve(
            self.provider,
            self.ledger,
            self.leases,
            claim,
            submission,
            request,
            self.stop,
            self.profile.id,
            self.throttles,
        )

    def _unknown_text(self, claim: Claim, submission: Submission, why: str) -> str:
        request, episode = self.request(claim, submission), self.gate.episode_id
        return unknown_text(self.provider, self.profile.id, episode, claim, request, why)

    def _collect(
        self, claim: Claim, submission_pk: int, remote_ref: str, options: RunOptions
    ) -> ItemResult:
        """Download, prove, store and verify, and only then complete (module docstring).

        Raises `RemoteJobFailed` (closed failed with its charge), `_NotAnImageOutput`
        (closed failed with the call's charge), `_NotStored` (nothing written: the
        submission stays accepted) and what the provider's collect raises."""
        price = self.provider.capabilities.price
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                result = self.provider.collect(
                    remote_ref, deadline_s=options.collect_timeout_s, should_stop=self.stop.is_set
                )
            except OutputGone as exc:
                why, pks = reason(exc), (submission_pk, claim.item.pk)
                text = record_gone(self.ledger.engine, self.gate, price, *pks, why, exc.compute_us)
                raise LostAtProvider(text) from None
            except RemoteJobFailed as exc:
                failed = failure_charge(price, self.profile, exc)
                self.ledger.close_failed(
                    submission_pk,
                    f"remote job failed: {reason(exc)}",
                    episode_pk=self.gate.episode_pk,
                    charge=failed,
                )
                self.hold_to_price(claim.run_id, remote_ref, failed)
                raise
            try:
                image: ProvenImage = prove_image(result.content)
                break
            except NotAnImage as exc:
                if attempt < DOWNLOAD_ATTEMPTS:
                    continue
                text = (
                    f"job {remote_ref[:80]}: the provider's output is {exc.reason} "
                    f"({DOWNLOAD_ATTEMPTS} downloads); not completed"
                )
                charge = price.settle(
                    reported_micros=result.reported_micros, compute_us=result.compute_us
                )
                self.ledger.close_failed(
                    submission_pk, text, episode_pk=self.gate.episode_pk, charge=charge
                )
                self.hold_to_price(claim.run_id, remote_ref, charge)
                raise _NotAnImageOutput(text) from None
        try:
            stored = keep_image(self.media, image)
        except MediaStoreError as exc:
            raise _NotStored(reason(exc)) from None
        charge = price.settle(
            reported_micros=result.reported_micros,
            compute_us=result.compute_us,
            pixels=image.width * image.height,
        )
        completed = self.ledger.complete(claim, submission_pk, self.gate.episode_pk, stored, charge)
        if completed:
            self.hold_to_price(claim.run_id, remote_ref, charge)
        return ItemResult.COMPLETED if completed else ItemResult.TAKEN_OVER

    def hold_to_price(self, run_id: str, remote_ref: str, charge: Charge | None) -> None:
        """Remember a charge above the price's bound (`prices.above_price`): every claim of
        the run then refuses new calls (`episodic.storage.budgets`); the `Runner` pauses it so."""
        why = above_price(self.provider.capabilities.price, self.profile, remote_ref, charge)
        if why is not None and self.price_breach is None:
            self.price_breach = why

    def holds(self, claim: Claim) -> bool:
        """The check right before a paid call: the claim is ours, live, and its run running.

        The transaction that made or loaded the claim proved exactly that; when it did so
        less than `CLAIM_PROOF_FRESH_S` ago (the usual case: the call follows the claim at
        once), that proof is the check and no other transaction is spent on it. A cancel
        that lands after the proof is seen before the next paid call, as with any check."""
        verified = claim.verified_at
        if verified is not None and time.monotonic() - verified < CLAIM_PROOF_FRESH_S:
            return True
        return self.leases.still_holds(claim)

    def _retry_not_created(self, claim: Claim, call: Callable[[], str]) -> str:
        """Send again only what provably created nothing (`episodic.pipeline.throttle.send`)."""
        holds = lambda: self.leases.still_holds(claim)  # noqa: E731
        return send(call, holds, self.stop, self.profile.id, self.throttles)
