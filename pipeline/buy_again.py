"""`episodic media restore E --buy-again`: what the provider no longer serves is bought
again, as a normal paid call; everything it still serves is restored free first.

In this order, so that nothing is bought before everything that can refuse has refused:

1. `episodic.pipeline.restore.restore`: every completed image the store lost is collected again from
   its recorded job (free). Only the items it reports ``not_served`` are candidates.
2. A candidate from an earlier plan than the current one is not bought (a generate of the
   current plan would never run it); a decided episode (approved, assembled, rejected) is
   refused in one line naming `episodic reopen`: a re-bought image has other bytes than the
   ones decided on, and what was approved is exactly what ships.
3. The quote (count, price per image of the current plan's profile, the exact total) is
   checked against the caps (``--max-cost``/``--max-images``, else EPISODIC_MAX_RUN_COST:
   `episodic.core.planning.budget_breach`, the rule every run obeys), then shown to `confirm`;
   refused (`BudgetExceeded`) or not confirmed (`CommandNotAllowed`): nothing written.
4. `MediaRecords.lose`: each candidate goes completed -> pending in one transaction, its lost
   output recorded (`lost_outputs`: which submission, key, sha256, when, why), its paid call
   kept as succeeded with its cost; a generated episode goes back to allocated. Each item
   whose output the provider deleted before it was collected (failed, and refused by every
   resume, retry and generate: `episodic.storage.provider_outputs`) goes failed -> pending:
   the confirmation was the decision to pay for it twice.
5. A buy-again run whose process died (killed: running, its lease expired, holding items
   recorded lost) is taken over and finished first (`episodic.pipeline.generation.resume`, the
   takeover every dead run gets: its accepted jobs are collected free, its intents
   reconciled, within the caps that run was confirmed with).
6. `pipeline.generation.generate` with ``--only`` the videos of every item recorded lost and
   not completed again (this process's and any other's): admission, dedup, claims, leases
   and the ledger decide exactly as for any generate, so two of these commands racing make
   one job per item, and the run's own budget guard counts the re-bought items again.

``BuyAgainReport.pending``: the items recorded lost and not completed when the free restore
ended (the restore's line counts them instead of saying every image is in the store).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from episodic.core.errors import BudgetExceeded, CommandNotAllowed
from episodic.core.money import format_money
from episodic.core.planning import RunOptions, budget_breach
from episodic.core.settings import Settings
from episodic.core.states import DECIDED_STATES
from episodic.pipeline.admission import dedup_policy
from episodic.pipeline.gate import CredentialSource, open_gate
from episodic.pipeline.generation import Prepared, generate, prepare, resume
from episodic.pipeline.item_dispatch import ItemExecutor, thread_pool_executor
from episodic.pipeline.outcomes import RunOutcome
from episodic.pipeline.restore import (
    DEFAULT_COLLECT_TIMEOUT_S,
    OnItem,
    OnPlan,
    RestoreReport,
    restore,
)
from episodic.storage.media_records import MediaRecords, RecordedImage, decided_refusal
from episodic.storage.provider_outputs import ProviderOutputs


@dataclass(frozen=True)
class Quote:
    """What buying again would cost: ``items`` (their ids) at ``price_micros`` each, in
    micro-units of ``currency``, ``total_micros`` in all, from provider profile ``profile``."""

    episode_id: str
    items: list[str]
    price_micros: int
    currency: str
    profile: str

    @property
    def total_micros(self) -> int:
        return self.price_micros * len(self.items)

    def describe(self) -> str:
        price = format_money(self.price_micros, self.currency)
        total = format_money(self.total_micros, self.currency)
        return (
            f"buying {len(self.items)} image{'' if len(self.items) == 1 else 's'} of "
            f"{self.episode_id} again "
            f"({', '.join(self.items)}) at {price} each from {self.profile}: {total}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "items": self.items,
            "count": len(self.items),
            "price_micros": self.price_micros,
            "total_micros": self.total_micros,
            "currency": self.currency,
            "profile": self.profile,
        }


@dataclass
class BuyAgainReport:
    """The free restore, what was quoted (None: nothing to buy), which items this process
    recorded lost, and the generation run that bought them (None: none was needed)."""

    restore: RestoreReport
    quote: Quote | None = None
    lost: list[str] | None = None
    outcome: RunOutcome | None = None
    earlier_plan: list[str] | None = None  # not served, not in the current plan: not bought
    pending: list[str] | None = None  # recorded lost, not completed when the restore ended

    @property
    def complete(self) -> bool:
        """Every completed image is in the store, and every one bought again completed."""
        bought = set(self.quote.items) if self.quote is not None else set()
        free = all(
            i.status in ("present", "imported", "restored") or i.item_id in bought
            for i in self.restore.items
        )
        return free and (self.outcome is None or self.outcome.exit_code == 0)

    def to_dict(self) -> dict[str, object]:
        return {
            **self.restore.to_dict(),
            "complete": self.complete,
            "paid_calls": self.outcome.counts.paid_submissions if self.outcome else 0,
            "buy_again": None if self.quote is None else self.quote.to_dict(),
            "recorded_lost": self.lost or [],
            "earlier_plan": self.earlier_plan or [],
            "pending": self.pending or [],
            "run": None if self.outcome is None else self.outcome.to_dict(),
        }


Confirm = Callable[[Quote], bool]


def buy_again(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    credentials: CredentialSource,
    options: RunOptions,
    confirm: Confirm,
    *,
    collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S,
    stop: threading.Event | None = None,
    on_plan: OnPlan | None = None,
    on_item: OnItem | None = None,
    executor: ItemExecutor = thread_pool_executor,
) -> BuyAgainReport:
    """Restore free, then buy again what the provider no longer serves (module docstring).

    `options`: the run's (``only`` is replaced by the lost items' videos); `confirm(quote)`
    is asked once, after the caps passed and before anything is written. Errors, all before
    any state moves or any paid call: those of `restore`, `CommandNotAllowed` (no plan, a
    decided episode, not confirmed; exit 2), `BudgetExceeded` (2)."""
    report = BuyAgainReport(
        restore(
            engine,
            settings,
            pipeline,
            episode_id,
            credentials,
            collect_timeout_s=collect_timeout_s,
            stop=stop,
            on_plan=on_plan,
            on_item=on_item,
        )
    )
    records = MediaRecords(engine)
    episode_pk = open_gate(engine, pipeline, episode_id, "restore").episode_pk
    report.pending = [label for label, _, _ in records.lost_unfinished(episode_pk)]
    if all(i.status != "not_served" for i in report.restore.items) and not report.pending:
        return report  # nothing to buy: no plan or profile needed
    prepared = prepare(engine, settings, pipeline, episode_id, "restore")
    gate = prepared.gate
    wanted, report.earlier_plan = _candidates(report.restore, records, prepared)
    # and what this or another process recorded lost and is not bought yet (one killed
    # after recording, one buying now): quoted and confirmed too, since this run may pay
    quoted = [image.item_id for image in wanted]
    quoted += [
        label for label, _, _ in records.lost_unfinished(gate.episode_pk) if label not in quoted
    ]
    if not quoted:
        return report
    if wanted and gate.episode.state in DECIDED_STATES:
        raise CommandNotAllowed(decided_refusal(gate.episode_id, gate.episode.state))
    profile = prepared.profile
    report.quote = quote = Quote(
        gate.episode_id, quoted, profile.pricing.estimate_micros, profile.currency, profile.id
    )
    _check_caps(quote, options, settings)
    if not confirm(quote):
        raise CommandNotAllowed(f"not confirmed: {quote.describe()}; nothing was bought")
    if wanted:
        lost = records.lose(gate.episode_pk, wanted, _REASON)
        report.lost = [image.item_id for image in wanted if image.item_pk in lost.item_pks]
    # outputs gone at the provider: failed and refused to every other run; now confirmed
    ProviderOutputs(engine).buy_again(gate.episode_pk, _GONE_REASON)
    dead = records.dead_runs_buying_lost(gate.episode_pk, dedup_policy(settings).fallback_lease_s)
    for run_id in dead:  # a buy-again killed mid-run: taken over, finished
        report.outcome = resume(engine, settings, run_id, credentials, executor=executor)
    left = records.lost_unfinished(gate.episode_pk)
    if left:  # this process's, and any another one recorded and has not bought
        report.outcome = generate(
            engine,
            settings,
            pipeline,
            episode_id,
            _bounded(options, quote, left),
            credentials,
            executor=executor,
        )
    return report


def _candidates(
    restored: RestoreReport, records: MediaRecords, prepared: Prepared
) -> tuple[list[RecordedImage], list[str]]:
    """The images restore found not served, by item row: those of the current plan (to buy
    again), and the ids of those of an earlier plan (a generate of the current plan would
    never run them: not bought)."""
    served = zip(restored.item_pks, restored.items, strict=True)
    not_served = {pk for pk, item in served if item.status == "not_served"}
    planned = {item.idempotency_key for item in prepared.items}
    images = [i for i in records.images(prepared.gate.episode_pk) if i.item_pk in not_served]
    wanted = [image for image in images if image.idempotency_key in planned]
    return wanted, [image.item_id for image in images if image not in wanted]


def _bounded(options: RunOptions, quote: Quote, left: list[tuple[str, int, int]]) -> RunOptions:
    """The run's options: ``--only`` the videos of the `left` items (recorded lost, not
    completed again), their own first call and retries after the calls already made, and
    no more paid calls nor cost than `quote` (an item of those videos that never completed,
    or one recorded lost since by another process, is not bought here: the run's own guard
    refuses it), within any --max-images/--max-cost given."""
    calls, cost = len(quote.items), quote.total_micros
    return replace(
        options,
        only=frozenset(position for _, position, _ in left),
        max_retries=options.max_retries + max(attempts for _, _, attempts in left),
        max_images=calls if options.max_images is None else min(calls, options.max_images),
        max_cost_micros=cost
        if options.max_cost_micros is None
        else min(cost, options.max_cost_micros),
    )


def _check_caps(quote: Quote, options: RunOptions, settings: Settings) -> None:
    """The rule every run obeys (`budget_breach`), on the re-bought items: refused in one
    line, nothing written."""
    if options.cap_micros is None:
        options = replace(options, cap_micros=settings.max_run_cost_micros)
    breach = budget_breach(len(quote.items), quote.total_micros, options)
    if breach is None:
        return
    limit = {
        "cap": f"the per-run cap EPISODIC_MAX_RUN_COST "
        f"({format_money(options.cap_micros or 0, quote.currency)}); pass --max-cost or "
        "--max-images to allow it",
        "max_images": f"--max-images {options.max_images}",
        "max_cost": f"--max-cost {format_money(options.max_cost_micros or 0, quote.currency)}",
    }[breach]
    raise BudgetExceeded(f"{quote.describe()}, above {limit}; nothing was bought")


_REASON = "media restore --buy-again: missing from the store, not served by its provider"
_GONE_REASON = "media restore --buy-again: its output was deleted at the provider"
