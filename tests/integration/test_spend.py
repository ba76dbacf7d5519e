"""`episodic spend` and `check`'s money audits, on SQLite and Postgres.

The ledger rows come from real generates on the fake provider (its log's ``job_created``
carries ``cost_micros``, its own bill). To place paid calls on either side of a week or a
month boundary of the pipeline's timezone, the test then moves their submissions'
``created_at`` (the moment a call is dated by) to chosen instants: the engine stamps the
current time, and a test cannot wait for Sunday midnight in Auckland.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, select, update

from episodic.pipeline.check import check_episodes
from episodic.pipeline.check_spend import verify_spend
from episodic.pipeline.pipelines import set_timezone
from episodic.pipeline.spend import spend_report, week_spend
from episodic.storage.models import CostEntryRow, SubmissionRow
from tests.generation import Episode, new_episode, provider_log, write_playlist

AUCKLAND = ZoneInfo("Pacific/Auckland")  # +13 in December: its weeks and months are not UTC's
PROFILES = (
    "profiles:\n"
    '  fake:\n    kind: fake\n    price: {per_image: "0.04"}\n'
    '  euro:\n    kind: fake\n    price: {per_image: "0.003"}\n    currency: EUR\n'
    '  mp:\n    kind: fake\n    price: {per_megapixel: "0.025", at_most: "1.05"}\n'
    '  sec:\n    kind: fake\n    price: {per_second: "0.000725", at_most: "20"}\n'
)


@pytest.fixture(autouse=True)
def fake_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    providers = tmp_path / "providers.yaml"
    providers.write_text(PROFILES)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(providers))


def generated(engine: Engine, folder: Path, titles: list[str], profile: str, key: str) -> Episode:
    episode = new_episode(engine, key)
    episode.plan(write_playlist(folder, titles, profile=profile))
    outcome = episode.generate()
    assert outcome.state == "completed", outcome
    return episode


def fakes_bill() -> int:
    """What the fake provider billed, by its own log."""
    return sum(int(e["cost_micros"]) for e in provider_log() if e["event"] == "job_created")


def date_calls(engine: Engine, moments: list[datetime]) -> None:
    """The submissions, oldest first, dated at `moments` (one each)."""
    with engine.begin() as conn:
        pks = conn.execute(select(SubmissionRow.id).order_by(SubmissionRow.id)).scalars().all()
        assert len(pks) == len(moments)
        for pk, moment in zip(pks, moments, strict=True):
            dated = update(SubmissionRow).where(SubmissionRow.id == pk)
            conn.execute(dated.values(created_at=moment))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from episodic.cli.app import run

    capsys.readouterr()
    code = run(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def by_group(report: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(r["group"], r["currency"]): (r["calls"], r["spent_micros"]) for r in report["groups"]}


# Wall-clock moments in Auckland: Sunday late / Monday early (ISO weeks 52 | 53 there, both
# week 52 in UTC), and New Year's Eve late / New Year's Day early (December | January
# there, both December 31st in UTC).
SUNDAY_LATE = datetime(2026, 12, 27, 23, 30, tzinfo=AUCKLAND)
MONDAY_EARLY = datetime(2026, 12, 28, 0, 30, tzinfo=AUCKLAND)
NYE_LATE = datetime(2026, 12, 31, 23, 30, tzinfo=AUCKLAND)
NEW_YEAR_EARLY = datetime(2027, 1, 1, 0, 30, tzinfo=AUCKLAND)


def test_weeks_and_months_are_the_pipelines_and_add_up_to_the_fakes_bill(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_timezone(engine, "weekly", "Pacific/Auckland")
    generated(engine, tmp_path / "a", ["a", "b", "c", "d"], "mp", "k:1")
    date_calls(engine, [SUNDAY_LATE, MONDAY_EARLY, NYE_LATE, NEW_YEAR_EARLY])
    bill = fakes_bill()
    each = bill // 4
    assert bill == 4 * each and each == 103  # 64x64 pixels at 0.025 per megapixel, rounded up

    weeks = spend_report(engine, by="week")
    assert by_group(weeks) == {("2026-W52", "USD"): (1, each), ("2026-W53", "USD"): (3, 3 * each)}
    months = spend_report(engine, by="month")
    assert by_group(months) == {("2026-12", "USD"): (3, 3 * each), ("2027-01", "USD"): (1, each)}
    for report in (weeks, months, spend_report(engine, by="episode")):
        assert report["totals"] == [
            {
                "currency": "USD",
                "calls": 4,
                "spent_micros": bill,
                "spent": "0.000412",
                "in_flight_calls": 0,
                "in_flight_micros": 0,
                "in_flight": "0.00",
            }
        ]
    # the week artifact's figures and the days of --since/--until are Auckland's too
    assert by_group(week_spend(engine, "weekly", "2026-W53")) == {("mp", "USD"): (3, 3 * each)}
    code, out, err = cli(
        capsys,
        "spend",
        "--group-by",
        "month",
        "--since",
        "2026-12-28",
        "--until",
        "2026-12-31",
        "--json",
    )
    assert code == 0, err
    assert by_group(json.loads(out)) == {("2026-12", "USD"): (2, 2 * each)}
    code, out, _ = cli(capsys, "spend", "--since", "2027-01-01", "--until", "2027-01-01", "--json")
    assert by_group(json.loads(out)) == {("2026-W53", "USD"): (1, each)}
    code, out, _ = cli(capsys, "spend", "--group-by", "week")
    assert code == 0 and "2026-W52" in out and "0.000103 USD" in out and "0.000412 USD" in out
    assert verify_spend(engine, "weekly").problems == []
    assert not [f for f in check_episodes(engine, "weekly") if f.check in ("cost", "spend")]


def test_check_finds_a_report_that_dates_calls_unlike_the_budgets(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each week's and month's row is held against the ledger's sum of that period's bounds
    (what the budgets count): a report that read the calls in UTC would be found."""
    import episodic.pipeline.spend
    from episodic.core import periods

    set_timezone(engine, "weekly", "Pacific/Auckland")
    generated(engine, tmp_path / "a", ["a", "b", "c", "d"], "fake", "k:1")
    date_calls(engine, [SUNDAY_LATE, MONDAY_EARLY, NYE_LATE, NEW_YEAR_EARLY])
    assert verify_spend(engine, "weekly").problems == []
    monkeypatch.setattr(
        episodic.pipeline.spend,
        "period_label",
        lambda kind, at, tz: periods.period_label(kind, at, UTC),
    )
    assert verify_spend(engine, "weekly").problems == [
        "spend --group-by week row 2026-W52 2 paid calls, 0.08 USD, "
        "but the ledger holds 1, 0.04 USD",
        "spend --group-by week row 2026-W53 2 paid calls, 0.08 USD, "
        "but the ledger holds 3, 0.12 USD",
        "spend --group-by month row 2026-12 4 paid calls, 0.16 USD, "
        "but the ledger holds 3, 0.12 USD",
        "spend --group-by month row 2027-01 0 paid calls, 0.00 USD, "
        "but the ledger holds 1, 0.04 USD",
    ]


def test_currencies_are_never_summed(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dollars = generated(engine, tmp_path / "a", ["a", "b"], "fake", "k:1")
    euros = generated(engine, tmp_path / "b", ["c", "d", "e"], "euro", "k:2")
    made = [e for e in provider_log() if e["event"] == "job_created"]
    assert {e["episode_id"] for e in made} == {dollars.episode_id, euros.episode_id}

    report = spend_report(engine, by="pipeline")
    assert by_group(report) == {("weekly", "EUR"): (3, 9_000), ("weekly", "USD"): (2, 80_000)}
    assert [(t["currency"], t["spent"]) for t in report["totals"]] == [
        ("EUR", "0.009"),
        ("USD", "0.08"),
    ]
    by_episode = spend_report(engine, by="episode")
    assert {(r["pipeline"], r["group"], r["currency"]) for r in by_episode["groups"]} == {
        ("weekly", dollars.episode_id, "USD"),
        ("weekly", euros.episode_id, "EUR"),
    }
    assert sum(t["spent_micros"] for t in report["totals"]) == fakes_bill()  # the fake's bill

    code, out, err = cli(capsys, "spend", "--group-by", "profile", "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == [
        "row",
        "by",
        "group",
        "pipeline",
        "currency",
        "calls",
        "spent",
        "spent_micros",
        "in_flight_calls",
        "in_flight",
        "in_flight_micros",
    ]
    groups = [r for r in rows if r["row"] == "group"]
    totals = {r["currency"]: r for r in rows if r["row"] == "total"}
    assert {(r["group"], r["currency"], r["spent"]) for r in groups} == {
        ("euro", "EUR", "0.009"),
        ("fake", "USD", "0.08"),
    }
    for currency, total in totals.items():
        mine = [r for r in groups if r["currency"] == currency]
        assert sum(int(r["spent_micros"]) for r in mine) == int(total["spent_micros"])
    code, out, _ = cli(capsys, "spend", "--group-by", "profile")
    assert code == 0 and "0.009 EUR" in out and "0.08 USD" in out


def test_in_flight_is_its_own_column(engine: Engine, tmp_path: Path) -> None:
    """An open submission counts at its reservation, beside (never inside) what was spent."""
    generated(engine, tmp_path / "a", ["a", "b"], "fake", "k:1")
    with engine.begin() as conn:
        first = conn.execute(select(SubmissionRow.id).order_by(SubmissionRow.id)).scalars().first()
        conn.execute(CostEntryRow.__table__.delete().where(CostEntryRow.submission_pk == first))
        conn.execute(
            update(SubmissionRow)
            .where(SubmissionRow.id == first)
            .values(state="accepted", reserved_micros=40_000, currency="USD")
        )
    (row,) = spend_report(engine, by="pipeline")["groups"]
    assert (row["calls"], row["spent"], row["in_flight_calls"], row["in_flight"]) == (
        1,
        "0.04",
        1,
        "0.04",
    )


def test_check_flags_a_cost_that_does_not_follow_from_its_basis(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    episode = generated(engine, tmp_path / "a", ["a", "b"], "mp", "k:1")
    generated(engine, tmp_path / "b", ["c"], "euro", "k:2")
    generated(
        engine, tmp_path / "c", ["d [[COMPUTE_MS:1500]]", "e [[COMPUTE_MS:20]]"], "sec", "k:3"
    )
    with engine.connect() as conn:
        recorded = conn.execute(
            select(CostEntryRow.basis, CostEntryRow.quantity, CostEntryRow.amount_micros).order_by(
                CostEntryRow.id
            )
        ).all()
    assert sorted(tuple(r) for r in recorded) == [
        ("per_image", 1, 3_000),
        ("per_megapixel", 4096, 103),  # 64 x 64 pixels at 0.025 per megapixel, rounded up
        ("per_megapixel", 4096, 103),
        ("per_second", 20_000, 15),
        ("per_second", 1_500_000, 1_088),  # 1.5 s at 0.000725 per second: 1087.5, rounded up
    ]
    code, out, err = cli(capsys, "check", "--all", "--json")
    assert code == 0, out + err
    clean = json.loads(out)
    assert clean["clean"] and clean["spend"]["verified"]
    ledger = {r["currency"]: r["spent_micros"] for r in clean["spend"]["ledger"]}
    assert ledger == {"EUR": 3_000, "USD": 206 + 1_088 + 15}
    assert sum(ledger.values()) == fakes_bill()  # the provider's own arithmetic agrees
    with engine.begin() as conn:  # one of the per-megapixel entries
        tampered = (
            conn.execute(select(CostEntryRow.id).where(CostEntryRow.basis == "per_megapixel"))
            .scalars()
            .first()
        )
        conn.execute(
            update(CostEntryRow).where(CostEntryRow.id == tampered).values(amount_micros=1_000_103)
        )
    code, out, err = cli(capsys, "check", "--all", "--json")
    assert code == 8, err
    found = json.loads(out)["findings"]
    assert [(f["episode_id"], f["check"]) for f in found] == [(episode.episode_id, "cost")]
    assert (
        f"cost entry {tampered} records 1.000103 USD but its basis makes 0.000103 USD"
        in (found[0]["detail"])
    )
    # the report still adds up to the (tampered) ledger: spend reads what was recorded
    assert json.loads(out)["spend"]["verified"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group-by", "year"], "unknown --group-by 'year'"),
        (["--since", "2026-02-30"], "invalid --since '2026-02-30'"),
        (["--until", "26-1-1"], "invalid --until '26-1-1'"),
        (["--since", "2026-12-02", "--until", "2026-12-01"], "--since 2026-12-02 is after"),
        (["--pipeline", "nowhere"], "unknown pipeline 'nowhere'"),
        (["--json", "--csv"], "not both"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    engine: Engine, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    set_timezone(engine, "weekly", "UTC")
    code, out, err = cli(capsys, "spend", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
