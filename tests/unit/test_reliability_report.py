"""The fault suite's own bookkeeping (reliability/): what it counts as a fault injected, as
data lost, and what it keeps of a failed trial. A report that cannot see a fault proves
nothing, so these parts are tested like the product."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from reliability.__main__ import keep_forensics, table_row
from reliability.harness import Result, signal_some
from reliability.oracle import sha256_of


def test_a_signal_that_reached_no_live_process_is_not_counted_as_a_fault() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert signal_some([done], random.Random(1)) == ("none (the processes had finished)", {})
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fault, signalled = signal_some([alive], random.Random(1))
        assert fault.endswith("x1 of 1") and fault.split()[0].startswith("SIG")
        assert list(signalled) == [0]  # the survivors' exits are checked by index
        assert alive.wait(10) != 0  # it did get the signal
    finally:
        alive.kill()


def test_an_image_missing_or_changed_is_seen(tmp_path: Path) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(b"png")
    recorded = sha256_of(str(image))
    assert recorded is not None
    image.write_bytes(b"other")
    assert sha256_of(str(image)) != recorded
    image.unlink()
    assert sha256_of(str(image)) is None


def test_any_problem_stuck_row_or_lost_datum_is_a_fault() -> None:
    assert Result("s", "sqlite").passed
    assert "| - |" in table_row(Result("s", "sqlite"))  # stuck rows not measured: shown as such
    assert not Result("s", "sqlite", stuck=1).passed
    assert not Result("s", "sqlite", lost=1).passed
    failed = Result("s", "sqlite")
    failed.problem("trial 3: exit 1")
    assert not failed.passed and "**FAULT**" in table_row(failed)


def test_the_rerun_command_repeats_the_same_choices() -> None:
    result = Result("flow-crash", "postgres", seed=42, scale=0.5)
    assert result.rerun().endswith("--only flow-crash --backend postgres --scale 0.5 --seed 42")


def test_a_failed_trials_forensics_outlive_the_runs_temporary_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "flow" / "home3").mkdir(parents=True)
    (run / "flow" / "home3" / "forensics.txt").write_text("stacks")
    result = Result("flow-crash", "sqlite")
    result.problem(f"trial 3: hung (see {run / 'flow' / 'home3' / 'forensics.txt'})")
    kept = tmp_path / "kept"
    keep_forensics(run, kept, [result])
    assert (kept / "flow" / "home3" / "forensics.txt").read_text() == "stacks"
    assert str(kept) in result.problems[0] and str(run) + "/" not in result.problems[0]
