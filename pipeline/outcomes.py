"""The words a run ends with: its outcome (state, exit code, counts) and the message that
tells the operator what happened and what to do next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.exit_codes import ExitCode
from core.hints import counted, hint
from core.planning import RunOptions
from core.runs import REPLANNED, PlanReport, RunCounts, budget_stopped, store_stopped
from core.states import RunState
from pipeline.gate import GatePass
from storage.runs import RunStore


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

    def to_dict(self) -> dict[str, Any]:
        return {
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
) -> RunOutcome:
    """The outcome of `run_id`, which this process left in `state` with its items at
    `counts` (a cancelled run's record is read for why it was cancelled)."""
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
        message = f"run {run_id}: {what}; resume with: {resume}"
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
            message = f"run {run_id} {why}; its calls in flight were collected; " + hint(
                f"to go on, pass a bigger limit: `episodic runs resume {run_id} --max-cost "
                "AMOUNT` (or --max-images N), or raise the budget: `episodic pipelines "
                f"set-budget {gate.pipeline} --per week|month AMOUNT`, then `episodic runs "
                f"resume {run_id}`",
                f"to go on, raise the budget (`episodic pipelines set-budget "
                f"{gate.pipeline} --per week|month AMOUNT`) or pass a bigger max_cost, and "
                f"run the generate deployment again for {gate.episode_id}",
            )
        elif store_stopped(why):  # paused at its first image the media store could not take
            message = (
                f"run {run_id} {why}; its accepted images are collected at no cost once "
                f"the store answers: {resume}"
            )
    return RunOutcome(run_id, state, code, counts, skipped, message, followed)


def nothing_to_do(gate: GatePass, report: PlanReport, options: RunOptions) -> RunOutcome:
    """The answer when no run was needed: every item completed, or the rest out of retries."""
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
