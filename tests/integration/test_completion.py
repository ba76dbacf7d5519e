"""A completion writes the item's image, the call's success and its cost together or not at
all, on SQLite and PostgreSQL (where the three are one statement): a holder whose claim was
taken over, or whose call already has an outcome, writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.media import StoredMedia, content_key
from episodic.core.pricing import Price
from episodic.core.runs import Claim
from episodic.core.states import RunState
from episodic.storage.base import utcnow
from episodic.storage.claims import ClaimStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore
from tests.generation import new_episode, new_run, write_playlist

PRICE = Price("per_image", 40_000, "USD", 1)
IMAGE = StoredMedia(content_key("a" * 64, "image/png"), "a" * 64, 10, "image/png")


def _accepted_claim(engine: Engine, tmp_path: Path, owner: str = "w1") -> tuple[Claim, int]:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one"]))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=60)
    (item,) = RunStore(engine).run_items(run_id)
    claim = ClaimStore(engine).claim(
        item.pk, run_id, owner, lease_s=60, max_attempts=3, profile="fake"
    )
    assert isinstance(claim, Claim) and claim.submission is not None
    assert LedgerStore(engine).accept(claim.submission.pk, "job-1")
    return claim, EpisodeRepository(engine).episode_pk("weekly", episode.episode_id)


def _rows(engine: Engine, claim: Claim) -> tuple[str, str, int]:
    assert claim.submission is not None
    with engine.connect() as conn:
        item = conn.execute(
            text("SELECT state FROM items WHERE id = :i"), {"i": claim.item.pk}
        ).scalar_one()
        sub = conn.execute(
            text("SELECT state FROM submissions WHERE id = :s"), {"s": claim.submission.pk}
        ).scalar_one()
        costs = conn.execute(
            text("SELECT count(*) FROM cost_entries WHERE submission_pk = :s"),
            {"s": claim.submission.pk},
        ).scalar_one()
    return item, sub, int(costs)


def test_a_completion_writes_the_image_the_success_and_the_cost(
    engine: Engine, tmp_path: Path
) -> None:
    claim, episode_pk = _accepted_claim(engine, tmp_path)
    assert claim.submission is not None
    ledger = LedgerStore(engine)
    assert ledger.complete(claim, claim.submission.pk, episode_pk, IMAGE, PRICE.charge(1))
    assert _rows(engine, claim) == ("completed", "succeeded", 1)
    with engine.connect() as conn:
        amount, key = conn.execute(
            text(
                "SELECT k.amount_micros, i.output_key FROM cost_entries k JOIN submissions s "
                "ON s.id = k.submission_pk JOIN items i ON i.id = s.item_pk WHERE s.id = :s"
            ),
            {"s": claim.submission.pk},
        ).one()
    assert (amount, key) == (40_000, IMAGE.key)
    # The same completion again (a retry after a lost COMMIT reply) answers what happened.
    assert ledger.complete(claim, claim.submission.pk, episode_pk, IMAGE, PRICE.charge(1))
    assert _rows(engine, claim) == ("completed", "succeeded", 1)


# What changed between the acceptance and the completion, and the rows it leaves.
INTERFERENCES = {
    # another owner took the item over (its lease ran out)
    "claim taken over": (
        "UPDATE items SET claim_owner = 'w2', lease_expires_at = :t WHERE id = :i",
        ("running", "accepted", 0),
    ),
    # the call was closed meanwhile (an operator, the sweep)
    "call has an outcome": (
        "UPDATE submissions SET state = 'failed' WHERE id = :s",
        ("running", "failed", 0),
    ),
}


@pytest.mark.parametrize("case", sorted(INTERFERENCES))
def test_a_completion_after_its_claim_or_call_moved_completes_nothing(
    engine: Engine, tmp_path: Path, case: str
) -> None:
    claim, episode_pk = _accepted_claim(engine, tmp_path)
    assert claim.submission is not None
    interference, left = INTERFERENCES[case]
    with engine.begin() as conn:
        conn.execute(
            text(interference),
            {"t": utcnow().replace(year=2100), "i": claim.item.pk, "s": claim.submission.pk},
        )
    ledger = LedgerStore(engine)
    assert not ledger.complete(claim, claim.submission.pk, episode_pk, IMAGE, PRICE.charge(1))
    assert _rows(engine, claim) == left
