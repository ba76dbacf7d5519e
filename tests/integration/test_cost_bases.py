"""Each cost basis end to end: a run through the engine against the fake and
against local servers shaped like Replicate's and fal's APIs (real pixel sizes, compute
times in the replies), on both backends. The ledger's rows carry the basis, the measured
quantity and the unit price, every amount follows from them, and their sum is the
provider's own bill (the fake's ``job_created.cost_micros``, a server's ``bill_micros``,
each computed by the provider's side with its own arithmetic) to the micro-unit. A week
mixes two bases in one pipeline; two currencies are reported each in its own, never summed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from episodic.core.exit_codes import ExitCode
from episodic.core.pricing import charge_of
from tests.generation import Episode, new_episode, provider_log, write_playlist
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer

Row = tuple[str, str, int, int, int, str]  # episode, basis, quantity, unit, amount, currency


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def ledger(engine: Engine) -> list[Row]:
    """Every cost entry, checked: its amount follows from its basis, quantity and price."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.episode_id, c.basis, c.quantity, c.unit_price_micros, "
                "c.amount_micros, c.currency FROM cost_entries c "
                "JOIN episodes e ON e.id = c.episode_pk ORDER BY c.id"
            )
        ).all()
    found = [(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), str(r[5])) for r in rows]
    for _episode, basis, quantity, unit, amount, _currency in found:
        assert charge_of(basis, unit, quantity) == amount, (basis, quantity, unit, amount)
    return found


def profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **entries: str) -> None:
    """A providers.yaml of `entries` (profile id -> its YAML fields, indented by 4)."""
    body = "".join(f"  {name}:\n{fields}" for name, fields in entries.items())
    (tmp_path / "providers.yaml").write_text(f"profiles:\n{body}")
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("IMAGE_KEY", TOKEN)


def fake_profile(price: str, currency: str = "USD") -> str:
    return f"    kind: fake\n    price: {price}\n    currency: {currency}\n"


def fake_bill() -> int:
    """What the fake provider billed, by its own log (one line per job it made)."""
    return sum(e["cost_micros"] for e in provider_log() if e["event"] == "job_created")


def run(episode: Episode, tmp_path: Path, name: str, titles: list[str], profile: str) -> None:
    episode.plan(write_playlist(tmp_path / name, titles, profile=profile))
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert outcome.counts.completed == len(titles)


# ------------------------------------------------------------------ the fake, every basis
FAKE_CASES = {
    # basis: (price, titles, the (quantity, unit) each item is charged on)
    "per_image": ('{per_image: "0.003"}', ["a", "b"], [(1, 3_000)] * 2),
    "per_megapixel": (
        '{per_megapixel: "0.025", at_most: "1.05"}',
        ["a [[SIZE:1000]]", "b [[SIZE:777]]"],  # 10^6 px; 603,729 px: 15,093.225 -> 15,094
        [(1_000_000, 25_000), (603_729, 25_000)],
    ),
    "per_whole_megapixel": (
        '{per_megapixel: "0.025", whole_megapixels: true, at_most: "2"}',
        ["a [[SIZE:1024]]", "b [[SIZE:777]]"],  # 1,048,576 px: 2 started megapixels; 1
        [(1_048_576, 25_000), (603_729, 25_000)],
    ),
    "per_second": (
        '{per_second: "0.000725", at_most: "20"}',
        ["a [[COMPUTE_MS:2803]]", "b"],  # 2.803 s: 2,032.175 -> 2,033; 2 s (the default)
        [(2_803_000, 725), (2_000_000, 725)],
    ),
}


@pytest.mark.parametrize("basis", sorted(FAKE_CASES))
def test_each_basis_against_the_fake_settles_to_the_fakes_own_bill(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, basis: str
) -> None:
    price, titles, charged = FAKE_CASES[basis]
    profiles(tmp_path, monkeypatch, priced=fake_profile(price))
    episode = new_episode(engine)
    run(episode, tmp_path, "pl", titles, "priced")
    rows = ledger(engine)
    assert sorted((r[2], r[3]) for r in rows) == sorted(charged)
    assert {r[1] for r in rows} == {basis} and {r[5] for r in rows} == {"USD"}
    assert sum(r[4] for r in rows) == fake_bill() > 0  # to the micro-unit
    assert episode.generate().counts.paid_submissions == 0  # nothing is bought twice


# ------------------------------------------------------------ servers shaped like the APIs
def replicate_fields(server: ReplicateServer, price: str, model: str) -> str:
    return (
        "    kind: replicate\n"
        f"    model: {model}\n"
        f"    base_url: {server.base_url}\n"
        "    credential_env: IMAGE_KEY\n"
        f"    price: {price}\n"
        "    timeout_s: 5.0\n"
        "    poll_interval_s: 0.02\n"
        "    lookup_by_input: true\n"
    )


def fal_fields(server: FalServer, price: str, image_size: str = "landscape_4_3") -> str:
    return (
        "    kind: fal\n"
        "    model: fal-ai/flux/dev\n"
        f"    base_url: {server.base_url}\n"
        "    credential_env: IMAGE_KEY\n"
        f"    price: {price}\n"
        f"    inputs: {{image_size: {image_size}}}\n"
        "    timeout_s: 5.0\n"
        "    poll_interval_s: 0.02\n"
    )


@pytest.fixture
def replicate_images() -> Iterator[ReplicateServer]:
    """flux-schnell: an official model, $0.003 per output image, webp 1024x1024."""
    with ReplicateServer(output_format="webp", billing="per_image", price_micros=3_000) as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def replicate_seconds() -> Iterator[ReplicateServer]:
    """A time-billed model on an A40 (Large): $0.000725 per second of predict_time."""
    with ReplicateServer(
        output_format="png", size=(768, 768), billing="per_second", price_micros=725
    ) as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def fal_megapixels() -> Iterator[FalServer]:
    """fal-ai/flux/dev: $0.025 per megapixel, every started megapixel billed."""
    with FalServer(billing="per_whole_megapixel", price_micros=25_000) as server:
        yield server  # type: ignore[misc]


def test_replicate_per_image_is_its_bill(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replicate_images: ReplicateServer,
) -> None:
    fields = replicate_fields(
        replicate_images, '{per_image: "0.003"}', "black-forest-labs/flux-schnell"
    )
    profiles(tmp_path, monkeypatch, schnell=fields)
    run(new_episode(engine), tmp_path, "pl", ["a", "b", "c"], "schnell")
    rows = ledger(engine)
    assert [(r[1], r[2], r[3]) for r in rows] == [("per_image", 1, 3_000)] * 3
    assert sum(r[4] for r in rows) == replicate_images.bill_micros == 9_000


def test_replicate_per_second_is_charged_on_its_reported_predict_time(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replicate_seconds: ReplicateServer,
) -> None:
    fields = replicate_fields(
        replicate_seconds, '{per_second: "0.000725", at_most: "30"}', "someone/time-billed"
    )
    profiles(tmp_path, monkeypatch, timed=fields)
    titles = ["a", "b [[COMPUTE_MS:12345]]", "c [[COMPUTE_MS:1]]"]
    run(new_episode(engine), tmp_path, "pl", titles, "timed")
    rows = ledger(engine)
    assert sorted(r[2] for r in rows) == [1_000, 2_803_618, 12_345_000]  # microseconds
    assert {(r[1], r[3]) for r in rows} == {("per_second", 725)}
    # 2.803618 s -> 2,032.623... -> 2,033; 12.345 s -> 8,950.125 -> 8,951; 1 ms -> 1
    assert sorted(r[4] for r in rows) == [1, 2_033, 8_951]
    assert sum(r[4] for r in rows) == replicate_seconds.bill_micros


@pytest.mark.parametrize(
    ("whole", "image_size", "titles", "pixels", "bill"),
    [
        # landscape_4_3 (fal's default) is 1024x768: 786,432 px, one started megapixel
        (True, "landscape_4_3", ["a", "b"], [786_432] * 2, 50_000),
        # square_hd is 1,048,576 px: two started megapixels; one item asks 512x512
        (True, "square_hd", ["a", "b [[SIZE:512x512]]"], [262_144, 1_048_576], 75_000),
        # exact: 0.025 x 0.786432 = 0.0196608 -> 19,661 micro-units each
        (False, "landscape_4_3", ["a", "b"], [786_432] * 2, 39_322),
    ],
)
def test_fal_per_megapixel_is_charged_on_the_stored_images_real_size(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    whole: bool,
    image_size: str,
    titles: list[str],
    pixels: list[int],
    bill: int,
) -> None:
    billing = "per_whole_megapixel" if whole else "per_megapixel"
    with FalServer(billing=billing, price_micros=25_000) as server:
        flag = ", whole_megapixels: true" if whole else ""
        price = f'{{per_megapixel: "0.025"{flag}, at_most: "2"}}'
        profiles(tmp_path, monkeypatch, dev=fal_fields(server, price, image_size))  # type: ignore[arg-type]
        run(new_episode(engine), tmp_path, "pl", titles, "dev")
        rows = ledger(engine)
        assert sorted(r[2] for r in rows) == sorted(pixels)
        assert {(r[1], r[3]) for r in rows} == {(billing, 25_000)}
        assert sum(r[4] for r in rows) == server.bill_micros == bill  # type: ignore[attr-defined]


def test_a_failed_fal_request_is_not_charged_as_fal_bills_none(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fal_megapixels: FalServer
) -> None:
    price = '{per_megapixel: "0.025", whole_megapixels: true, at_most: "2"}'
    profiles(tmp_path, monkeypatch, dev=fal_fields(fal_megapixels, price))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b [[REMOTE_FAIL]]"], profile="dev"))
    outcome = episode.generate(max_retries=0)
    assert outcome.counts.completed == 1 and outcome.counts.failed == 1
    rows = ledger(engine)
    assert sum(r[4] for r in rows) == fal_megapixels.bill_micros == 25_000
    assert outcome.counts.cost_micros == 25_000


# ------------------------------------------------------ a mixed week, and two currencies
def test_a_week_mixing_two_bases_in_one_pipeline_adds_up_to_both_bills(
    engine: Engine,
    database_url: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replicate_images: ReplicateServer,
    fal_megapixels: FalServer,
) -> None:
    schnell = replicate_fields(
        replicate_images, '{per_image: "0.003"}', "black-forest-labs/flux-schnell"
    )
    dev = fal_fields(
        fal_megapixels, '{per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}'
    )
    profiles(tmp_path, monkeypatch, schnell=schnell, dev=dev)
    first, second = new_episode(engine, "test:1"), new_episode(engine, "test:2")
    assert first.episode_id[:8] == second.episode_id[:8] == "2026-W32"  # one ISO week
    run(first, tmp_path, "one", ["a", "b"], "schnell")
    run(second, tmp_path, "two", ["c", "d", "e"], "dev")
    rows = ledger(engine)
    by_episode = {
        episode: {(r[1], r[2], r[3]) for r in rows if r[0] == episode}
        for episode in (first.episode_id, second.episode_id)
    }
    assert by_episode == {
        first.episode_id: {("per_image", 1, 3_000)},
        second.episode_id: {("per_whole_megapixel", 786_432, 25_000)},
    }
    week = sum(r[4] for r in rows)
    assert week == replicate_images.bill_micros + fal_megapixels.bill_micros == 6_000 + 75_000
    from episodic.cli.app import run as cli

    capsys.readouterr()
    assert cli(["spend", "--group-by", "profile", "--json"]) == 0  # the week's spend, per profile
    spent = json.loads(capsys.readouterr().out)
    assert {(g["group"], g["spent_micros"]) for g in spent["groups"]} == {
        ("schnell", replicate_images.bill_micros),
        ("dev", fal_megapixels.bill_micros),
    }
    assert [t["spent_micros"] for t in spent["totals"]] == [week]  # one currency: one total


def test_two_currencies_are_each_reported_in_their_own_and_never_summed(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from episodic.cli.app import run as cli

    profiles(
        tmp_path,
        monkeypatch,
        euros=fake_profile('{per_image: "0.003"}', "EUR"),
        dollars=fake_profile('{per_megapixel: "0.025", at_most: "1"}', "USD"),
    )
    euro, dollar = new_episode(engine, "test:1"), new_episode(engine, "test:2")
    euro.plan(write_playlist(tmp_path / "eu", ["a", "b"], profile="euros"))
    dollar.plan(write_playlist(tmp_path / "us", ["c [[SIZE:1000]]"], profile="dollars"))
    capsys.readouterr()
    assert cli(["generate", euro.episode_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["cost_micros"], shown["currency"]) == (6_000, "EUR")
    assert cli(["generate", dollar.episode_id]) == 0
    out = capsys.readouterr().out
    assert "cost 0.025 USD" in out and "EUR" not in out
    totals: dict[str, int] = {}
    for row in ledger(engine):
        totals[row[5]] = totals.get(row[5], 0) + row[4]
    assert totals == {"EUR": 6_000, "USD": 25_000}  # each its own; no 0.031 of anything
    bills: dict[str, Any] = {}
    for entry in provider_log():
        if entry["event"] == "job_created":
            currency = "EUR" if entry["episode_id"] == euro.episode_id else "USD"
            bills[currency] = bills.get(currency, 0) + entry["cost_micros"]
    assert bills == totals
    # the week's spend, per currency and never summed across them, and check agrees
    assert cli(["spend", "--group-by", "week", "--json"]) == 0
    week = json.loads(capsys.readouterr().out)
    assert {(t["currency"], t["spent_micros"]) for t in week["totals"]} == set(totals.items())
    # dated by when each call was made (core.periods): this week, one row per currency
    (this_week,) = {g["group"] for g in week["groups"]}
    assert sorted(g["currency"] for g in week["groups"]) == ["EUR", "USD"], this_week
    assert cli(["check", "--all", "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["clean"] and checked["spend"]["verified"]


# ------------------------------------------------------------------ --plan and bad prices
def test_plan_states_the_estimate_its_basis_and_bound_and_a_bad_price_is_exit_2(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from episodic.cli.app import run as cli

    price = '{per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}'
    profiles(tmp_path, monkeypatch, dev=fake_profile(price))
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="dev"))
    capsys.readouterr()
    assert cli(["generate", episode.episode_id, "--plan"]) == 0
    out = capsys.readouterr().out
    said = "estimated 0.075 USD: 3 x at most 1 started megapixel at 0.025 USD (an estimate"
    assert said in out, out
    assert cli(["generate", episode.episode_id, "--plan", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["estimated_cost_micros"], shown["basis"], shown["estimate_quantity"]) == (
        75_000,
        "per_whole_megapixel",
        1_000_000,
    )
    for bad in ("{per_image: 0.003}", '{per_image: "1e-3"}', '{per_image: "0"}'):
        profiles(tmp_path, monkeypatch, dev=fake_profile(bad))
        assert cli(["generate", episode.episode_id, "--plan"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
        assert "profile 'dev'" in err and "price" in err, err
    assert provider_log() == [] and ledger(engine) == []  # nothing bought, nothing written


def test_a_failed_time_billed_prediction_is_charged_the_time_it_ran(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replicate_seconds: ReplicateServer,
) -> None:
    """Replicate bills a failed prediction for its predict_time: so does the ledger."""
    fields = replicate_fields(
        replicate_seconds, '{per_second: "0.000725", at_most: "30"}', "someone/time-billed"
    )
    profiles(tmp_path, monkeypatch, timed=fields)
    episode = new_episode(engine)
    titles = ["a", "b [[COMPUTE_MS:4000]] [[REMOTE_FAIL]]"]
    episode.plan(write_playlist(tmp_path / "pl", titles, profile="timed"))
    outcome = episode.generate(max_retries=0)
    assert (outcome.counts.completed, outcome.counts.failed) == (1, 1)
    rows = ledger(engine)
    assert sorted(r[2] for r in rows) == [2_803_618, 4_000_000]  # the failed one's 4 s too
    assert sum(r[4] for r in rows) == replicate_seconds.bill_micros == 2_033 + 2_900
    assert outcome.counts.cost_micros == 2_033 + 2_900


# ------------------------------------------------------------------ our http protocol
@pytest.mark.parametrize(
    ("options", "price", "basis", "quantity", "each"),
    [
        # the reply's own figure is what the ledger records (basis "reported")
        (
            {"report_cost": True, "price_micros": 12_345},
            '{per_image: "0.05"}',
            "reported",
            12_345,
            12_345,
        ),
        # per second of the reply's metrics.predict_time: 7.25 s x 0.000725 = 0.00525625
        (
            {"compute_s": 7.25, "price_micros": 725},
            '{per_second: "0.000725", at_most: "10"}',
            "per_second",
            7_250_000,
            5_257,
        ),
    ],
)
def test_our_http_protocol_settles_on_what_its_reply_reports(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, Any],
    price: str,
    basis: str,
    quantity: int,
    each: int,
) -> None:
    from tests.http_server import TOKEN as HTTP_TOKEN
    from tests.http_server import PredictionsServer

    with PredictionsServer(**options) as server:
        fields = (
            f"    kind: http\n    base_url: {server.base_url}\n    credential_env: HTTP_KEY\n"
            f"    price: {price}\n    timeout_s: 2\n    poll_interval_s: 0.02\n"
        )
        profiles(tmp_path, monkeypatch, ours=fields)
        monkeypatch.setenv("HTTP_KEY", HTTP_TOKEN)
        run(new_episode(engine), tmp_path, "pl", ["a", "b"], "ours")
        rows = ledger(engine)
        assert [(r[1], r[2], r[4]) for r in rows] == [(basis, quantity, each)] * 2
        assert sum(r[4] for r in rows) == server.bill_micros == 2 * each


def test_fal_per_second_is_charged_on_the_completed_statuss_inference_time(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FalServer(billing="per_second", price_micros=725, compute_s=1.2249955059960485) as fal:
        price = '{per_second: "0.000725", at_most: "10"}'
        profiles(tmp_path, monkeypatch, timed=fal_fields(fal, price))  # type: ignore[arg-type]
        episode = new_episode(engine)
        titles = ["a", "b [[COMPUTE_MS:3000]]", "c [[REMOTE_FAIL]]"]
        episode.plan(write_playlist(tmp_path / "pl", titles, profile="timed"))
        outcome = episode.generate(max_retries=0)
        assert (outcome.counts.completed, outcome.counts.failed) == (2, 1)
        rows = ledger(engine)
        # 1.2249955... s -> 1,224,996 us -> 888.12... -> 889; 3 s -> 2,175; the failure: 0
        assert sorted((r[1], r[2], r[4]) for r in rows) == [
            ("per_second", 1_224_996, 889),
            ("per_second", 3_000_000, 2_175),
        ]
        assert sum(r[4] for r in rows) == fal.bill_micros  # type: ignore[attr-defined]
