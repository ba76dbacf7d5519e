"""What a paid generation run is asked to do: its options, how each item is
classified before the run, and the one budget rule (a plan's guard and a re-buy obey it).

Plain data and rules; the admission (`pipeline.admission`) and the run (`pipeline.runner`)
use them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from episodic.core.dedup import check_dedup_options
from episodic.core.errors import BudgetExceeded, InvalidInput
from episodic.core.ids import shown
from episodic.core.money import format_money, micros_from_minor, parse_money
from episodic.core.playlist import MAX_CANDIDATES
from episodic.core.runs import ItemSnapshot, PlanReport
from episodic.core.selection import MAX_SELECTION_CHARS
from episodic.core.states import ItemState, SubmissionState

DEFAULT_LEASE_S = 30.0
DEFAULT_COLLECT_TIMEOUT_S = 600.0

# The ranges of a generate request's numbers, inclusive; the CLI's options and the generate
# flow's parameters are declared from them, and `GenerateRequest` checks them again.
CONCURRENCY_RANGE = (1, 64)
MAX_RETRIES_RANGE = (0, 20)
MAX_IMAGES_RANGE = (0, 999_999_999)  # nine digits, as an amount's whole part
COLLECT_TIMEOUT_RANGE = (1, 86_400)
HERO_CANDIDATES_RANGE = (1, MAX_CANDIDATES)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What a person asks one generate to do, as the CLI's options, the generate flow's
    parameters or a Python caller give it; refused (`InvalidInput`, exit 2) on construction
    unless every value keeps the rules: whole numbers in their ranges (never a bool), an
    amount of at most six decimals (`parse_money`), the dedup options together
    (`check_dedup_options`). The selection `only` is read against the plan later
    (`options_from_request`), once the episode's videos are known."""

    episode_id: str
    only: str | None = None
    concurrency: int = 4
    max_retries: int = 2
    max_images: int | None = None
    max_cost: str | None = None  # in the provider's currency, e.g. "2.50" or "0.003"
    force_resubmit: bool = False
    collect_timeout_s: int = int(DEFAULT_COLLECT_TIMEOUT_S)
    hero_candidates: int | None = None
    idempotency_key: str | None = None
    batch_id: str | None = None
    allow_duplicate: bool = False

    def __post_init__(self) -> None:
        _whole("--concurrency", self.concurrency, CONCURRENCY_RANGE)
        _whole("--max-retries", self.max_retries, MAX_RETRIES_RANGE)
        _whole("--collect-timeout", self.collect_timeout_s, COLLECT_TIMEOUT_RANGE)
        if self.max_images is not None:
            _whole("--max-images", self.max_images, MAX_IMAGES_RANGE)
        if self.hero_candidates is not None:
            _whole("--hero-candidates", self.hero_candidates, HERO_CANDIDATES_RANGE)
        if self.max_cost is not None:
            parse_money(self.max_cost)
        if self.only is not None and (
            not isinstance(self.only, str) or len(self.only) > MAX_SELECTION_CHARS
        ):
            raise InvalidInput(f"invalid --only: at most {MAX_SELECTION_CHARS} characters")
        for name, flag in (
            ("--force-resubmit", self.force_resubmit),
            ("--allow-duplicate", self.allow_duplicate),
        ):
            if not isinstance(flag, bool):
                raise InvalidInput(f"invalid {name} {shown(flag)}: expected true or false")
        check_dedup_options(self.idempotency_key, self.batch_id, self.allow_duplicate)

    @property
    def max_cost_micros(self) -> int | None:
        return None if self.max_cost is None else parse_money(self.max_cost)


def _whole(name: str, value: object, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(
            f"invalid {name} {shown(value)}: expected a whole number {low} to {high}"
        )


@dataclass(frozen=True, slots=True)
class RunLimits:
    """A run's limits as the claim holds them against its money (`storage.budgets`): at most
    `max_images` paid calls, and `max_cost_micros` of spend + in flight + the next call
    (`cost_label` names the limit in a refusal: --max-cost, or the per-run cap)."""

    max_images: int | None = None
    max_cost_micros: int | None = None
    cost_label: str = "--max-cost"


@dataclass(frozen=True, slots=True)
class RunOptions:
    only: frozenset[int] | None = None
    concurrency: int = 4
    max_retries: int = 2
    max_images: int | None = None
    max_cost_micros: int | None = None
    lease_s: float = DEFAULT_LEASE_S  # a claim lives this long without a heartbeat
    force_resubmit: bool = False
    # how long an accepted job is collected (polled, downloaded) before the item is left
    # for the next run to collect, at no cost
    collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S
    # EPISODIC_MAX_RUN_COST in micro-units: applies when neither max_images nor max_cost is
    # given (a 100,000-image playlist never starts by default)
    cap_micros: int | None = None

    @property
    def max_attempts(self) -> int:
        """Paid calls an item may get, counted across runs (the first one and its retries)."""
        return self.max_retries + 1

    @property
    def limits(self) -> RunLimits:
        """The limits every claim of the run checks: --max-images and --max-cost when
        either is given, else the per-run cap (EPISODIC_MAX_RUN_COST), as `budget_breach`."""
        if self.max_images is None and self.max_cost_micros is None:
            return RunLimits(None, self.cap_micros, "the per-run cap EPISODIC_MAX_RUN_COST")
        return RunLimits(self.max_images, self.max_cost_micros)

    def with_limits(
        self, max_images: int | None, max_cost_micros: int | None, *, force_resubmit: bool
    ) -> RunOptions:
        """A resumed run's options: the limits the operator passed to go on past a cap
        replace the recorded ones (each claim holds them against everything the run spent)."""
        return replace(
            self,
            force_resubmit=force_resubmit,
            max_images=self.max_images if max_images is None else max_images,
            max_cost_micros=self.max_cost_micros if max_cost_micros is None else max_cost_micros,
        )

    def params(self) -> dict[str, Any]:
        """The options as a run records them (the cap is the installation's, not the run's)."""
        return {
            "only": sorted(self.only) if self.only is not None else None,
            "concurrency": self.concurrency,
            "max_retries": self.max_retries,
            "max_images": self.max_images,
            "max_cost_micros": self.max_cost_micros,
            "lease_s": self.lease_s,
            "force_resubmit": self.force_resubmit,
            "collect_timeout_s": self.collect_timeout_s,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any], cap_micros: int | None = None) -> RunOptions:
        """The options `params` recorded; `cap_micros`: the per-run cap that applies now."""
        only = params.get("only")
        return cls(
            only=frozenset(only) if only is not None else None,
            concurrency=params["concurrency"],
            max_retries=params["max_retries"],
            max_images=params.get("max_images"),
            max_cost_micros=_max_cost(params),
            lease_s=float(params.get("lease_s", DEFAULT_LEASE_S)),
            force_resubmit=params.get("force_resubmit", False),
            collect_timeout_s=float(params.get("collect_timeout_s", DEFAULT_COLLECT_TIMEOUT_S)),
            cap_micros=cap_micros,
        )


def _max_cost(params: dict[str, Any]) -> int | None:
    """--max-cost as a run recorded it: micro-units, or whole cents by a run recorded before
    money was exact (``max_cost_minor``)."""
    if params.get("max_cost_micros") is not None:
        return int(params["max_cost_micros"])
    legacy = params.get("max_cost_minor")
    return None if legacy is None else micros_from_minor(int(legacy))


class Classification(StrEnum):
    """What a run would do with one item (`classify`)."""

    NEW = "new"
    SKIP = "skip"
    BUSY = "busy"
    COLLECT = "collect"
    RECONCILE = "reconcile"
    RETRY = "retry"
    EXHAUSTED = "exhausted"
    LOST = "lost"  # its paid output is gone at the provider: only buy-again buys it again


PAID = frozenset({Classification.NEW, Classification.RETRY})
"""The classifications that cost a paid call."""


def classify(snapshot: ItemSnapshot | None, options: RunOptions, now: datetime) -> Classification:
    """The planning rules, for one item (None: not in the database yet).

    Advisory: what a run *would* do. The claim (`episodic.storage.claims`) decides atomically.
    """
    if snapshot is None:
        return Classification.NEW
    if snapshot.state == ItemState.COMPLETED:
        return Classification.SKIP
    if snapshot.held(now):  # a live claim: its holder finishes it
        return Classification.BUSY
    # pending, cancelled, failed, or running under an expired claim (its holder died)
    if snapshot.open_submission == SubmissionState.ACCEPTED:
        return Classification.COLLECT
    if snapshot.open_submission in (SubmissionState.INTENT, SubmissionState.UNKNOWN):
        return Classification.RECONCILE
    if snapshot.output_gone:  # paid for; buying it again is `media restore --buy-again`'s
        return Classification.LOST
    if snapshot.attempts >= options.max_attempts:
        return Classification.EXHAUSTED
    return Classification.NEW if snapshot.attempts == 0 else Classification.RETRY


Limit = Literal["cap", "max_images", "max_cost"]


def budget_breach(calls: int, cost_micros: int, options: RunOptions) -> Limit | None:
    """The budget rule: the limit that `calls` paid calls costing `cost_micros` (minor
    units) break, or None. --max-images and --max-cost when either is given; else the
    per-run cap (EPISODIC_MAX_RUN_COST, `options.cap_micros`), if any."""
    if options.max_images is None and options.max_cost_micros is None:
        cap = options.cap_micros
        return "cap" if cap is not None and cost_micros > cap else None
    if options.max_images is not None and calls > options.max_images:
        return "max_images"
    if options.max_cost_micros is not None and cost_micros > options.max_cost_micros:
        return "max_cost"
    return None


def check_budget(report: PlanReport, options: RunOptions) -> None:
    """Refuse (`BudgetExceeded`, exit 2, nothing written) a plan above --max-images,
    --max-cost, or, when neither is given, the configured per-run cap."""
    breach = budget_breach(report.new_calls, report.estimated_cost_micros, options)
    if breach == "cap":
        cap = options.cap_micros
        assert cap is not None
        raise BudgetExceeded(
            f"plan: {report.new_calls} new paid calls, estimated "
            f"{format_money(report.estimated_cost_micros, report.currency)}, above the "
            f"per-run cap EPISODIC_MAX_RUN_COST ({format_money(cap, report.currency)}); pass "
            "--max-cost or --max-images to allow it (or raise the cap); nothing was created"
        )
    if breach == "max_images":
        raise BudgetExceeded(
            f"plan needs {report.new_calls} new paid calls, --max-images allows "
            f"{options.max_images}; nothing was created"
        )
    if breach == "max_cost":
        assert options.max_cost_micros is not None
        raise BudgetExceeded(
            f"plan would cost {format_money(report.estimated_cost_micros, report.currency)} "
            f"(estimated), --max-cost allows "
            f"{format_money(options.max_cost_micros, report.currency)}; nothing was created"
        )
