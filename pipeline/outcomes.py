"""The words a run ends with: its outcome (state, exit code, counts) and the message that
tells the operator what happened and what to do next."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from episodic.core.exit_codes import ExitCode
from episodic.core.hints import counted, hint
from episodic.core.money import format_totals
from episodic.core.planning import RunOptions
from episodic.core.runs import (
    REPLANNED,
    PlanReport,
    RunCounts,
    budget_stopped,
    price_stopped,
    store_stopped,
    throttle_stopped,
)
from episodic.core.states import ItemState, RunState
from episodic.pipeline.gate import GatePass
from episodic.pipeline.gone import LOST_TEXT
from episodic.pipeline.unknowns import UNKNOWN_TEXT
from episodic.providers.profiles import Profile
from episodic.storage.provider_outputs import ProviderOutputs
from episodic.storage.runs import RunStore


@dataclass(frozen=True, slots=True)
class Worked:
    """What this process did on a run: items it completed, and how many of them were jobs
    accepted before it (left by a killed or interrupted process, or an earlier attempt),
    collected at no new cost."""

    completed: int = 0
    collected_earlier: int = 0


@dataclass(frozen=True, slots=True)
class Tally:
    """A run that stopped buying at a limit, counted from the ledger once this process was
    done: what it collected here (`Worked`), its items still holding an open paid call (an
    accepted job not collected, an unknown outcome), and its items not bought."""

    collected: int
    collected_earlier: int
    not_collected: int
    not_bought: int

    def to_dict(self) -> dict[str, int]:
        return {
            "collected": self.collected,
            "collected_earlier": self.collected_earlier,
            "not_collected": self.not_collected,
            "not_bought": self.not_bought,
        }

    def words(self, run_id: str) -> str:
        """Only what happened: each count, whatever it is."""
        collected = f"collected {counted(self.collected, 'image')} here"
        if self.collected_earlier:
            collected += (
                f" ({self.collected_earlier} of {'it' if self.collected == 1 else 'them'} "
                f"accepted before this process)"
            )
        left = (
            f"{counted(self.not_collected, 'paid call')} still open, not collected "
            f"(`episodic runs show {run_id}` says why)"
            if self.not_collected
            else "no paid call left uncollected"
        )
        return f"{collected}; {left}; {counted(self.not_bought, 'image')} not bought"


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str | None  # None: nothing to do, no run was created
    state: RunState
    exit_code: ExitCode
    counts: RunCounts
    skipped: int
    message: str
    followed: tuple[str, ...] = ()  # other runs whose claims this run waited for
    deduplicated: bool = False  # the run already existed for the same request: joined
    # a run stopped at a limit: what this process collected, and what it left (`Tally`)
    tally: Tally | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **({} if self.tally is None else self.tally.to_dict()),
            "run_id": self.run_id,
            "deduplicated": self.deduplicated,
            "state": self.state.value,
            "exit_code": int(self.exit_code),
            "skipped": self.skipped,
            "message": self.message,
            "followed_runs": list(self.followed),
            **self.counts.to_dict(),
        }


def run_ended(
    store: RunStore,
    gate: GatePass,
    run_id: str,
    state: RunState,
    counts: RunCounts,
    skipped: int,
    followed: tuple[str, ...],
    profile: Profile | None = None,
    here: Worked | None = None,
) -> RunOutcome:
    """The outcome of `run_id`, which this process left in `state` with its items at
    `counts` (a cancelled run's record is read for why it was cancelled). A failed run's
    line carries its first failed item's message (the provider's own words among them) and
    the next step its causes call for (`next_steps`), never a resume that cannot help.
    `here`: what this process did, for a run it stopped at a limit (its line counts it)."""
    tally = None
    resume = hint(
        f"episodic runs resume {run_id}",
        f"run the generate deployment again for {gate.episode_id} (it resumes run "
        f"{run_id} and pays nothing twice)",
    )
    if state == RunState.COMPLETED:
        code, message = ExitCode.OK, f"run {run_id} completed"
        if followed:
            message += f" (followed items in progress by run {', '.join(followed)})"
    elif state == RunState.FAILED:
        code = ExitCode.PARTIAL if counts.completed or skipped else ExitCode.RUN_FAILED
        what = (
            f"{counted(counts.failed, 'item')} failed"
            if code == ExitCode.PARTIAL
            else "every item failed"
        )
        failed = [i for i in store.run_items(run_id, [ItemState.FAILED]) if i.error_text]
        said = f" ({failed[0].item_id}: {failed[0].error_text})" if failed else ""
        steps = next_steps([i.error_text or "" for i in failed], run_id, resume, profile)
        message = f"run {run_id}: {what}{_bounded(said)}" + (f"; {steps}" if steps else "")
    elif state == RunState.CANCELLED:
        code = ExitCode.INTERRUPTED
        message = f"run {run_id} was cancelled; it stopped before its next paid call"
        if store.get_run(run_id).error_text == REPLANNED:
            message = (
                f"run {run_id} was cancelled: episode {gate.episode_id} was re-planned "
                "while it worked, and it stopped before paying for anything the new plan "
                "does not ask for; "
                + hint(
                    f"`episodic generate {gate.episode_id}` generates the new plan",
                    f"run the generate deployment again for {gate.episode_id}",
                )
            )
    elif state == RunState.RUNNING:  # paused and resumed elsewhere while this one stopped
        code = ExitCode.INTERRUPTED
        message = (
            f"run {run_id} stopped here and goes on in another process; follow it with: "
            f"episodic runs show {run_id}"
        )
    else:
        code = ExitCode.INTERRUPTED
        message = f"run {run_id} interrupted and paused; resume with: {resume}"
        why = store.get_run(run_id).error_text
        if budget_stopped(why):  # paused at a cap or a period budget: exit 7
            code = ExitCode.BUDGET_REACHED
            tally = _tally(store, run_id, counts, here or Worked())
            message = f"run {run_id} {why}; {tally.words(run_id)}; " + hint(
                f"to go on, pass a bigger limit: `episodic runs resume {run_id} --max-cost "
                "AMOUNT` (or --max-images N), or raise the budget: `episodic pipelines "
                f"set-budget {gate.pipeline} --per week|month AMOUNT`, then `episodic runs "
                f"resume {run_id}`",
                f"to go on, raise the budget (`episodic pipelines set-budget "
                f"{gate.pipeline} --per week|month AMOUNT`) or pass a bigger max_cost, and "
                f"run the generate deployment again for {gate.episode_id}",
            )
        elif price_stopped(why):  # the provider billed a call above its price's bound: exit 7
            code = ExitCode.BUDGET_REACHED
            message = (
                f"run {run_id} {why}; its calls in flight were collected; correct the "
                f"profile's price (at_most, or the price itself), then: {resume}"
            )
        elif throttle_stopped(why):  # the provider's throttle outlasted the bound
            message = f"run {run_id} {why}; resume then with: {resume}"
        elif store_stopped(why):  # paused at its first image the media store could not take
            message = (
                f"run {run_id} {why}; its accepted images are collected at no cost once "
                f"the store answers: {resume}"
            )
    lost, paid = ProviderOutputs(store.engine).lost_at_provider(run_id)
    if lost:  # paid outputs the provider deleted first: resuming cannot collect them
        message += (
            f"; {counted(lost, 'paid output')} deleted at the provider before "
            f"{'it was' if lost == 1 else 'they were'} collected ({format_totals(paid)}): "
            f"`episodic media restore {gate.episode_id} --pipeline {gate.pipeline} "
            f"--buy-again` buys {'it' if lost == 1 else 'them'} again"
        )
    return RunOutcome(run_id, state, code, counts, skipped, message, followed, tally=tally)


def _tally(store: RunStore, run_id: str, counts: RunCounts, here: Worked) -> Tally:
    """`Tally` of a run this process stopped at a limit, its items read now."""
    still_open = len(store.with_open_submission(run_id))
    unfinished = counts.pending + counts.failed + counts.running
    return Tally(here.completed, here.collected_earlier, still_open, unfinished - still_open)


_REFUSED = re.compile(r"(?:create|result) refused: HTTP (\d{3})")
_SAID_LIMIT = 600  # the first failed item's message, as the run's last line repeats it


def _bounded(text: str) -> str:
    return text if len(text) <= _SAID_LIMIT else text[: _SAID_LIMIT - 2] + "…)"


def credential_source(profile: Profile | None) -> str:
    """Where a profile's credential comes from, as a person fixes it (never the value)."""
    if profile is None:
        return "its credential"
    if profile.credential_env:
        return f"the environment variable {profile.credential_env}"
    if profile.credential_secret_block:
        return f"the Prefect Secret block {profile.credential_secret_block}"
    return "its credential"


def next_steps(texts: list[str], run_id: str, resume: str, profile: Profile | None) -> str:
    """The way on for a failed run, by the causes its failed items' messages name (the
    phrases `core.provider_text.refused_text` and `pipeline.unknowns.UNKNOWN_TEXT` write):
    a credential refused (401/403): fix it where it comes from; 402: add credit at the
    provider; 422 (the provider's validation of our input: the same input is refused again,
    so a bare resume cannot help): fix the input its words name, in the profile's inputs or
    the prompt; an unknown outcome: look the job up and adopt it; an output gone at the
    provider: nothing here (the caller names `media restore --buy-again`); otherwise a
    resume. "" when no step is left."""
    codes = {int(m[1]) for text in texts if (m := _REFUSED.search(text))}
    name = f"profile {profile.id!r}" if profile is not None else "the provider profile"
    steps: list[str] = []
    if codes & {401, 403}:
        check = f"`episodic providers check {profile.id}`" if profile else "`providers check`"
        steps.append(
            f"the provider refused the credential of {name}: fix {credential_source(profile)} "
            f"({check} verifies it without spending), then {resume}"
        )
    if 402 in codes:
        steps.append(
            f"the provider wants payment: add credit to the account of {name} at the "
            f"provider (its billing page), then {resume}"
        )
    if 422 in codes:
        check = f"`episodic providers check {profile.id}`" if profile else "`providers check`"
        steps.append(
            "the provider refused the input it was sent (HTTP 422; its words name the field): "
            f"fix that input in the `inputs` of {name} ({check} verifies input names without "
            f"spending), then {resume}; if it is the prompt, fix it in the playlist and plan "
            "the episode again"
        )
    unknown = sum(1 for text in texts if text.startswith(UNKNOWN_TEXT))
    if unknown and texts[0].startswith(UNKNOWN_TEXT):  # the quoted message says how
        steps.append(
            f"{counted(unknown, 'paid call')} of unknown outcome: find each job at the "
            "provider and adopt it as said (pays nothing; `episodic runs show "
            f"{run_id}` has each item's words)"
        )
    elif unknown:
        steps.append(
            "a paid call's outcome is unknown: find the job at the provider (`episodic runs "
            f"show {run_id}` says where, and any candidates) and adopt it: `episodic runs "
            f"adopt {run_id} ITEM --job ID` (verified, pays nothing); only if it is not "
            f"there: `episodic runs resume {run_id} --force-resubmit`"
        )
    # an output gone at the provider: the run's line names `media restore --buy-again`
    # (`lost_at_provider`), the one command that buys it again; a resume cannot collect it
    others = [t for t in texts if not t.startswith(LOST_TEXT)]
    if (
        (not steps and others)
        or len(codes - {401, 402, 403, 422})
        or any(not _REFUSED.search(t) and not t.startswith(UNKNOWN_TEXT) for t in others)
    ):
        steps.append(f"{'for the other items, ' if steps else ''}resume with: {resume}")
    return "; ".join(steps)


def nothing_to_do(gate: GatePass, report: PlanReport, options: RunOptions) -> RunOutcome:
    """The answer when no run was needed: every item completed, or the rest out of retries
    or gone at the provider (paid for; bought again only by `media restore --buy-again`)."""
    if report.lost:
        code = ExitCode.PARTIAL if report.skipped else ExitCode.RUN_FAILED
        message = (
            f"{gate.episode_id}: {counted(report.lost, 'paid output')} "
            f"{'was' if report.lost == 1 else 'were'} deleted at the provider before "
            f"{'it was' if report.lost == 1 else 'they were'} collected; nothing else can "
            f"collect {'it' if report.lost == 1 else 'them'}: `episodic media restore "
            f"{gate.episode_id} --pipeline {gate.pipeline} --buy-again` quotes buying "
            f"{'it' if report.lost == 1 else 'them'} again and asks before it pays"
        )
        if report.exhausted:
            message += f"; {counted(report.exhausted, 'other item')} out of retries"
        return RunOutcome(None, RunState.FAILED, code, RunCounts(), report.skipped, message)
    if report.exhausted:
        max_retries = options.max_retries
        code = ExitCode.PARTIAL if report.skipped else ExitCode.RUN_FAILED
        message = (
            f"{gate.episode_id}: {counted(report.exhausted, 'item')} failed "
            f"{options.max_attempts} times and {'is' if report.exhausted == 1 else 'are'} out "
            "of retries; "
            + hint(
                f"run `episodic generate {gate.episode_id} --max-retries "
                f"{max_retries + 1}` to allow another paid attempt",
                f"run the generate deployment with max_retries={max_retries + 1} to "
                "allow another paid attempt",
            )
        )
        return RunOutcome(None, RunState.FAILED, code, RunCounts(), report.skipped, message)
    message = f"{gate.episode_id}: all {report.skipped} items already completed; nothing to do"
    return RunOutcome(None, RunState.COMPLETED, ExitCode.OK, RunCounts(), report.skipped, message)
