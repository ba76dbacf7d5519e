"""Hero runs from the command line: N paid candidates of one video's image, and
the reviewer picks the one that ships.

Money is counted at the fake provider (its own log of the jobs it made), on SQLite and on
Postgres. Commands run in this process through the CLI's own entry point (`episodic.cli.app.run`:
the same parsing, exit codes and one-line errors as the installed command, without the
interpreter's start-up per call); interrupts are real signals to a real `episodic generate`
process, and the run a plan shrinks under is a real process too.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.generation import (
    generate_in_background,
    jobs_per_key,
    made_jobs_per_key,
    provider_log,
    stored_image,
    until_jobs,
    write_playlist,
)

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
EPISODE = "2026-W32-0"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """`episodic ARGS` in this process: (exit code, stdout, stderr) as the command gives."""
    from episodic.cli.app import run

    def call(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        with monkeypatch.context() as scoped:
            for name, value in (env or {}).items():
                scoped.setenv(name, value)
            capsys.readouterr()
            code = run(list(args))
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["episodic", *args], code, out, err)

    return call


@pytest.fixture(autouse=True)
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_LEASE_S", "5")


def _planned(cli: Cli, tmp_path: Path, **playlist: object) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    path = write_playlist(tmp_path / "pl", ["harbor", "market"], **playlist)  # type: ignore[arg-type]
    done = cli("plan", EPISODE, "--playlist", str(path))
    assert done.returncode == 0, done.stderr


def _ok(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def _refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def _state(cli: Cli) -> str:
    return str(_ok(cli("episodes", "show", EPISODE, "--json"))["state"])


def test_asking_for_6_candidates_after_4_pays_for_2(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    _planned(cli, tmp_path, hero={1: 4})
    shown = _ok(cli("generate", EPISODE, "--plan", "--json"))
    assert (shown["new_calls"], shown["hero_calls"], shown["estimated_cost_micros"]) == (
        5,
        4,
        200_000,
    )
    assert _ok(cli("generate", EPISODE, "--json"))["state"] == "completed"
    first = jobs_per_key()
    assert len(first) == 5 and set(first.values()) == {1}

    grown = _ok(cli("generate", EPISODE, "--hero-candidates", "6", "--plan", "--json"))
    assert (grown["new_calls"], grown["hero_calls"], grown["skipped"]) == (2, 2, 5)
    assert jobs_per_key() == first  # --plan spent nothing
    assert _ok(cli("generate", EPISODE, "--hero-candidates", "6", "--json"))["state"] == (
        "completed"
    )
    after = jobs_per_key()
    assert len(after) == 7 and set(after.values()) == {1}  # exactly 2 more jobs
    assert after.keys() > first.keys()  # the first four candidates kept their keys
    # the plan now says 6: a plain generate and a second --hero-candidates 6 pay nothing
    assert _ok(cli("generate", EPISODE, "--json"))["paid_submissions"] == 0
    assert (
        _ok(cli("generate", EPISODE, "--hero-candidates", "6", "--json"))["paid_submissions"] == 0
    )
    assert jobs_per_key() == after
    assert cli("check", "--all").returncode == 0


def test_the_budget_guard_counts_the_candidates(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    _planned(cli, tmp_path, hero={1: 4})
    _refused(
        cli("generate", EPISODE, "--hero-candidates", "12", "--max-images", "10"),
        "plan needs 13 new paid calls, --max-images allows 10",
    )
    _refused(
        cli("generate", EPISODE, "--hero-candidates", "50", "--max-cost", "1.00"),
        "plan would cost 2.04 USD",
    )
    _refused(  # the default cap: 13 candidates x 4 cents under a 0.40 cap
        cli("generate", EPISODE, "--hero-candidates", "12", env={"EPISODIC_MAX_RUN_COST": "0.40"}),
        "above the per-run cap",
    )
    assert provider_log() == [] or jobs_per_key() == {}
    # refused runs recorded no plan either: the plan still has 4 candidates
    assert _ok(cli("generate", EPISODE, "--plan", "--json"))["new_calls"] == 5
    for bad in ("0", "51", "x", "1.5"):
        result = cli("generate", EPISODE, "--hero-candidates", bad)
        assert result.returncode == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupt_in_the_middle_of_the_candidates_then_retry_pays_each_once(
    cli: Cli, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "400")
    _planned(cli, tmp_path, hero={1: 8, 2: 4})
    process = generate_in_background(EPISODE, "--json", "--concurrency", "2")
    until_jobs(process, 3)
    process.send_signal(sig)
    process.communicate(timeout=60)
    assert process.returncode == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert len(jobs_per_key()) < 12  # interrupted in the middle of the candidates
    done = _ok(cli("retry", EPISODE, "--json"))
    assert done["state"] == "completed" and done["failed"] == 0
    jobs = made_jobs_per_key()  # the jobs the provider holds: a kill can precede a log line
    assert len(jobs) == 12 and set(jobs.values()) == {1}, jobs
    assert cli("check", "--all").returncode == 0


def test_approval_needs_a_pick_within_range_for_every_hero_video(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    _planned(cli, tmp_path, hero={1: 3})
    _ok(cli("generate", EPISODE, "--json"))
    approve = ("approve", EPISODE, "--by", "ann")
    _refused(cli(*approve), "no pick for v01")
    _refused(cli(*approve, "--pick", "v01=4"), "v01 has candidates 1-3; 4 is not one of them")
    _refused(cli(*approve, "--pick", "v01=0"), "expected e.g. v01=2,v02=1")
    _refused(cli(*approve, "--pick", "v01=1,v02=1"), "video 'v02' has no hero candidates")
    _refused(cli(*approve, "--pick", "v01=1,v01=2"), "picked twice")
    _refused(cli(*approve, "--pick", "v09=1"), "has no hero candidates")
    _refused(cli(*approve, "--pick", "v01=1\x1b[2J"), "control characters")
    _refused(
        cli("approve", EPISODE, "--reject", "--by", "ann", "--reason", "no", "--pick", "v01=1"),
        "is for approving",
    )
    assert _state(cli) == "generated"  # nothing was recorded
    assert _ok(cli(*approve, "--pick", "v01=2", "--json"))["picks"] == {"v01": 2}
    assert _state(cli) == "approved"
    assert _ok(cli(*approve, "--pick", "v01=2", "--json"))["changed"] is False  # a double click
    _refused(cli(*approve, "--pick", "v01=3"), "already approved with the picks v01=2")
    # a plan without hero runs: a pick is refused, and approval needs none
    assert cli("allocate", "--key", "k2", "--week", "2026-W32").returncode == 0
    plain = write_playlist(tmp_path / "plain", ["a"])
    assert cli("plan", "2026-W32-1", "--playlist", str(plain)).returncode == 0
    _ok(cli("generate", "2026-W32-1", "--json"))
    _refused(cli("approve", "2026-W32-1", "--by", "ann", "--pick", "v01=1"), "no hero candidates")
    assert _ok(cli("approve", "2026-W32-1", "--by", "ann", "--json"))["state"] == "approved"


def _assembled(cli: Cli, pick: int) -> tuple[bytes, dict[str, object]]:
    assert _ok(cli("approve", EPISODE, "--by", "ann", "--pick", f"v01={pick}", "--json"))
    assembled = _ok(cli("assemble", EPISODE, "--json"))
    cover = stored_image(str(assembled["cover"]))
    manifest = json.loads(stored_image(str(assembled["manifest"])))
    checked = cli("check", EPISODE)
    assert checked.returncode == 0, checked.stdout
    return cover, manifest


def _store_file(key: str) -> Path:
    """The local media store's file under `key` (to tamper with it behind the store)."""
    from episodic.core.settings import load_settings

    return load_settings().home_path / "media" / key


def _reopen_and_regenerate(cli: Cli) -> None:
    _ok(cli("reopen", EPISODE, "--by", "ann", "--reason", "other pick", "--json"))
    assert _ok(cli("generate", EPISODE, "--json"))["paid_submissions"] == 0


def test_assembly_ships_exactly_the_picked_candidate_byte_for_byte(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    _planned(cli, tmp_path, hero={1: 3})
    _ok(cli("generate", EPISODE, "--json"))
    paid = jobs_per_key()
    cover_2, manifest_2 = _assembled(cli, 2)
    _reopen_and_regenerate(cli)
    cover_3, manifest_3 = _assembled(cli, 3)
    _reopen_and_regenerate(cli)
    cover_2_again, manifest_2_again = _assembled(cli, 2)
    assert cover_2 == cover_2_again and manifest_2 == manifest_2_again  # deterministic
    assert cover_2 != cover_3
    assert jobs_per_key() == paid  # picking again paid nothing

    for manifest, pick in ((manifest_2, 2), (manifest_3, 3)):
        items = manifest["items"]
        assert isinstance(items, list)
        assert [i["item_id"] for i in items] == [f"v01.c{pick}", "v02.p1"]
        (hero,) = manifest["heroes"]  # type: ignore[misc]
        assert hero["video_id"] == "v01" and hero["picked"] == pick
        assert [c["candidate"] for c in hero["candidates"]] == [1, 2, 3]
        picked = hero["candidates"][pick - 1]
        assert items[0]["idempotency_key"] == picked["idempotency_key"]
        assert items[0]["sha256"] == picked["sha256"]
        image = stored_image(str(items[0]["key"]))  # named by its store key
        assert hashlib.sha256(image).hexdigest() == picked["sha256"]
        assert manifest["total_cost_micros"] == 40_000 * 4  # every paid candidate counts
    shown = _ok(cli("episodes", "show", EPISODE, "--json"))
    assert shown["state"] == "assembled"


def test_check_finds_an_approval_without_picks_and_a_manifest_that_ships_another(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    from sqlalchemy import update

    from episodic.storage.engine import make_engine
    from episodic.storage.models import EpisodeEventRow

    _planned(cli, tmp_path, hero={1: 2})
    _ok(cli("generate", EPISODE, "--json"))
    _, manifest = _assembled(cli, 1)
    stored = _store_file(str(_ok(cli("assemble", EPISODE, "--json"))["manifest"]))
    text = stored.read_text()  # rewritten behind the store's back
    stored.write_text(text.replace('"picked": 1', '"picked": 2'))
    found = cli("check", EPISODE)
    assert found.returncode == 8
    assert "manifest ships v01 candidate 2, the approval picked 1" in found.stdout
    stored.write_text(text)
    engine = make_engine(database_url)
    with engine.begin() as conn:  # an approval recorded without its picks
        conn.execute(
            update(EpisodeEventRow)
            .where(EpisodeEventRow.kind == "approved")
            .values(detail={"by": "ann", "note": None})
        )
    engine.dispose()
    found = cli("check", EPISODE)
    assert found.returncode == 8 and "picks: episode is assembled but" in found.stdout
    assert "no pick for v01" in found.stdout
    refused = cli("assemble", EPISODE)
    assert refused.returncode == 2 and "no pick for v01" in refused.stderr
    assert manifest["items"]  # the first assembly shipped


# Hero runs and money: a refused request, a plan shrunk under a running run.


def test_a_refused_hero_candidates_request_leaves_the_plan_as_it_was(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """Exit 2 means nothing was done: a --hero-candidates run refused for its credential or
    for a reused idempotency key records no plan (the next plain generate would pay for
    candidates nobody ran)."""
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  paid:\n    kind: http\n    base_url: http://127.0.0.1:9/v1\n"
        "    credential_env: HERO_TOKEN_UNSET\n    cost_per_image_minor: 4\n"
    )
    paid = {"EPISODIC_PROVIDERS_FILE": str(profiles)}
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    path = write_playlist(tmp_path / "paid", ["a", "b"], profile="paid")
    assert cli("plan", EPISODE, "--playlist", str(path), env=paid).returncode == 0
    _refused(cli("generate", EPISODE, "--hero-candidates", "4", env=paid), "is not set")
    assert _ok(cli("generate", EPISODE, "--plan", "--json", env=paid))["new_calls"] == 2

    assert cli("allocate", "--key", "k2", "--week", "2026-W32").returncode == 0
    plain = write_playlist(tmp_path / "plain", ["a", "b"])
    assert cli("plan", "2026-W32-1", "--playlist", str(plain)).returncode == 0
    _ok(cli("generate", "2026-W32-1", "--idempotency-key", "K1", "--json"))
    _refused(
        cli("generate", "2026-W32-1", "--idempotency-key", "K1", "--hero-candidates", "3"),
        "K1",
    )
    again = _ok(cli("generate", "2026-W32-1", "--plan", "--json"))
    assert (again["new_calls"], again["skipped"]) == (0, 2)  # still the plan of 2 images
    assert sum(jobs_per_key().values()) == 2


def test_hero_candidates_that_cannot_apply_are_refused_before_anything(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    _planned(cli, tmp_path, hero={1: 2})
    _ok(cli("generate", EPISODE, "--json"))
    listed = cli("runs", "list", "--episode", EPISODE, "--json")
    run_id = str(json.loads(listed.stdout)[0]["run_id"])
    _refused(cli("generate", EPISODE, "--resume", run_id, "--hero-candidates", "3"), "--resume")
    _ok(cli("approve", EPISODE, "--by", "ann", "--pick", "v01=1", "--json"))
    for extra in ((), ("--plan",)):  # --plan says what the command would say: refused
        _refused(cli("generate", EPISODE, "--hero-candidates", "3", *extra), "its plan is frozen")
    assert sum(jobs_per_key().values()) == 3


def test_a_run_of_a_plan_that_shrank_and_was_approved_buys_nothing_more(
    cli: Cli, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generate --hero-candidates 12` is running when the plan is shrunk to 2 and
    approved: that run must not go on to buy candidates 7-12 for an approved episode. Its
    next claim cancels it, it says why, the manifest's total is
    what the plan's candidates cost, and the old run is not resumed."""
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "500")
    _planned(cli, tmp_path, hero={1: 2})
    big = generate_in_background(EPISODE, "--hero-candidates", "12", "--concurrency", "1", "--json")
    until_jobs(big, 3)
    shrunk = _ok(cli("generate", EPISODE, "--hero-candidates", "2", "--json"))
    assert shrunk["state"] == "completed"  # v01's first two candidates and v02
    assert _ok(cli("approve", EPISODE, "--by", "ann", "--pick", "v01=1", "--json"))["changed"]
    made_at_approval = sum(jobs_per_key().values())
    out, err = big.communicate(timeout=120)
    assert big.returncode == 130, err
    answer = json.loads(out)
    assert answer["state"] == "cancelled" and "re-planned" in answer["message"]
    assert sum(jobs_per_key().values()) <= made_at_approval + 1  # at most the call in flight
    assert sum(jobs_per_key().values()) < 12
    assert set(jobs_per_key().values()) == {1}
    _refused(cli("runs", "resume", str(answer["run_id"])), "earlier plan")
    before = jobs_per_key()
    assert _ok(cli("retry", EPISODE, "--json"))["state"] == "completed"  # the current plan's
    assert jobs_per_key() == before
    assembled = _ok(cli("assemble", EPISODE, "--json"))
    manifest = json.loads(stored_image(str(assembled["manifest"])))
    assert [len(h["candidates"]) for h in manifest["heroes"]] == [2]
    assert manifest["total_cost_micros"] == 40_000 * 3  # v01's two candidates and v02
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout


def test_check_is_clean_through_reopen_and_a_second_approval(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """The stored manifest of an earlier assembly is not held against a reopened episode
    or a new approval that is not assembled yet (false findings, exit 1, before)."""
    _planned(cli, tmp_path, hero={1: 3, 2: 3})
    _ok(cli("generate", EPISODE, "--json"))
    _ok(cli("approve", EPISODE, "--by", "ann", "--pick", "v01=1,v02=2", "--json"))
    _ok(cli("assemble", EPISODE, "--json"))
    assert cli("check", "--all").returncode == 0
    _ok(cli("reopen", EPISODE, "--by", "ann", "--reason", "again", "--json"))
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout
    _ok(cli("generate", EPISODE, "--json"))
    _ok(cli("approve", EPISODE, "--by", "ann", "--pick", "v01=3,v02=3", "--json"))
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout
    _ok(cli("assemble", EPISODE, "--json"))
    checked = cli("check", "--all")
    assert checked.returncode == 0, checked.stdout
    shown = _ok(cli("episodes", "show", EPISODE, "--json"))
    [key] = [m["key"] for m in shown["media"] if m["name"] == "v01.c3"]  # type: ignore[union-attr]
    image = _store_file(str(key))
    image.write_bytes(image.read_bytes() + b"x")
    found = cli("check", EPISODE)
    assert found.returncode == 8 and "image v01.c3 does not match" in found.stdout
