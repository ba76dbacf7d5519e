"""Random sequences of claims, paid calls, lost replies, interrupts and deaths of holders,
from two runs of one episode and three owners, on SQLite and PostgreSQL: no
sequence reaches a forbidden state or makes a second job at the provider.

The provider is a model here: it makes a job per client reference (it honours idempotency,
as the fake provider does), and counts the jobs made per item. The holders follow the
engine's rules: a paid call only after the claim still holds, an unsent intent withdrawn,
an unknown reconciled by asking the provider.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import Engine, text

from episodic.core.media import StoredMedia, content_key
from episodic.core.pricing import Price
from episodic.core.runs import Claim
from episodic.core.states import RunState
from episodic.storage.base import utcnow
from episodic.storage.claims import ClaimStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore
from tests.generation import new_episode, new_run, write_playlist

ITEMS = 3
OWNERS = {"a1": "A", "a2": "A", "b1": "B"}  # owner -> which of the two runs it works for

FOUR_CENTS = Price("per_image", 40_000, "USD", 1)


def test_claims_and_paid_calls_never_make_a_second_job(engine: Engine, tmp_path: Path) -> None:
    class Holders(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            episode = new_episode(engine, f"model-{uuid.uuid4().hex[:12]}")
            episode.plan(
                write_playlist(tmp_path / uuid.uuid4().hex, [f"p{n}" for n in range(ITEMS)])
            )
            runs = RunStore(engine)
            episodes = EpisodeRepository(engine)
            self.runs = {name: new_run(episode) for name in ("A", "B")}
            for run_id in self.runs.values():
                runs.transition_run(run_id, RunState.RUNNING, lease_s=60)
            self.items = [item.pk for item in runs.run_items(self.runs["A"])]
            self.episode_pk = episodes.episode_pk("weekly", episode.episode_id)
            self.store = ClaimStore(engine)
            self.leases = LeaseStore(engine)
            self.ledger = LedgerStore(engine)
            self.held: dict[tuple[str, int], Claim] = {}
            self.sent: set[tuple[str, int]] = set()  # holder made the paid call
            self.jobs: dict[str, str] = {}  # client reference -> job (the provider)
            self.jobs_per_item: Counter[int] = Counter()
            self.stale: list[Claim] = []  # holders whose item was taken over, call still out

        def _create(self, claim: Claim) -> str:
            """The provider: one job per client reference."""
            assert claim.submission is not None
            ref = claim.submission.client_reference
            if ref not in self.jobs:
                self.jobs[ref] = f"job-{uuid.uuid4().hex[:8]}"
                self.jobs_per_item[claim.item.pk] += 1
            return self.jobs[ref]

        @rule(owner=st.sampled_from(sorted(OWNERS)), n=st.integers(0, ITEMS - 1))
        def claim(self, owner: str, n: int) -> None:
            pk = self.items[n]
            if (owner, pk) in self.held:
                return
            got = self.store.claim(
                pk, self.runs[OWNERS[owner]], owner, lease_s=60, max_attempts=3, profile="fake"
            )
            if isinstance(got, Claim):
                for other in [k for k in self.held if k[1] == pk]:  # taken over
                    self.stale.append(self.held.pop(other))
                self.held[(owner, pk)] = got

        @rule(data=st.data(), lose_reply=st.booleans())
        def send(self, data: st.DataObject, lose_reply: bool) -> None:
            ready = sorted(
                k for k, c in self.held.items() if c.action == "submit" and k not in self.sent
            )
            if not ready:
                return
            key = data.draw(st.sampled_from(ready))
            claim = self.held[key]
            assert claim.submission is not None
            if not self.leases.still_holds(claim):  # the engine's check before paying
                self.ledger.withdraw(claim, claim.submission)
                del self.held[key]
                return
            job = self._create(claim)
            self.sent.add(key)
            if lose_reply:
                self.ledger.mark_unknown(claim.submission.pk, "reply lost")
            else:
                self.ledger.accept(claim.submission.pk, job)

        @rule(data=st.data())
        def reconcile(self, data: st.DataObject) -> None:
            ready = sorted(k for k, c in self.held.items() if c.action == "reconcile")
            if not ready:
                return
            key = data.draw(st.sampled_from(ready))
            claim = self.held[key]
            assert claim.submission is not None
            # Asking the provider by client reference (or resending it: idempotent).
            self.ledger.accept(claim.submission.pk, self._create(claim))
            self.sent.add(key)

        @rule(data=st.data(), stale=st.booleans())
        def refused(self, data: st.DataObject, stale: bool) -> None:
            """The provider refuses a call (it made no job for it): the holder closes its
            submission failed. A stale holder's refusal may arrive after the new holder's
            resend of the same submission was accepted."""
            if stale:
                pool = [c for c in self.stale if c.submission is not None]
            else:
                pool = [
                    c
                    for k, c in sorted(self.held.items())
                    if c.action == "submit" and k not in self.sent
                ]
            if not pool:
                return
            claim = data.draw(st.sampled_from(pool))
            assert claim.submission is not None
            self.ledger.refuse(claim, claim.submission.pk, "400 refused")
            self.leases.release(claim, "refused")
            if stale:
                self.stale.remove(claim)
            else:
                del self.held[(claim.owner, claim.item.pk)]

        @rule(data=st.data())
        def complete(self, data: st.DataObject) -> None:
            ready = sorted(self.held)
            if not ready:
                return
            key = data.draw(st.sampled_from(ready))
            claim = self.held[key]
            assert claim.submission is not None
            with engine.connect() as conn:
                state = conn.execute(
                    text("SELECT state FROM submissions WHERE id = :s"),
                    {"s": claim.submission.pk},
                ).scalar_one_or_none()
            if state != "accepted":
                return
            image = StoredMedia(content_key("0" * 64, "image/png"), "0" * 64, 1, "image/png")
            self.ledger.complete(
                claim, claim.submission.pk, self.episode_pk, image, FOUR_CENTS.charge(1)
            )
            del self.held[key]
            self.sent.discard(key)

        @rule(owner=st.sampled_from(sorted(OWNERS)))
        def interrupt(self, owner: str) -> None:
            for key in [k for k in self.held if k[0] == owner]:
                claim = self.held.pop(key)
                if key not in self.sent and claim.action == "submit" and claim.submission:
                    self.ledger.withdraw(claim, claim.submission)  # provably never sent
                self.sent.discard(key)
            self.leases.release_all(owner, "interrupted")

        @rule(owner=st.sampled_from(sorted(OWNERS)), frozen=st.booleans())
        def die(self, owner: str, frozen: bool) -> None:
            """kill -9: nothing more from this holder; its leases run out. Frozen (a stopped
            VM, a GC pause): its leases run out too, but it wakes and goes on as if it held."""
            for key in [k for k in self.held if k[0] == owner and not frozen]:
                del self.held[key]
                self.sent.discard(key)
            with engine.begin() as conn:
                conn.execute(
                    text("UPDATE items SET lease_expires_at = :t WHERE claim_owner = :o"),
                    {"t": utcnow().replace(year=2000), "o": owner},
                )

        @invariant()
        def one_job_per_item_and_no_forbidden_state(self) -> None:
            assert all(n <= 1 for n in self.jobs_per_item.values()), self.jobs_per_item
            with engine.connect() as conn:
                pks = {"p": self.episode_pk}
                open_subs = conn.execute(
                    text(
                        "SELECT s.item_pk, count(*) FROM submissions s JOIN items i ON i.id = "
                        "s.item_pk WHERE i.episode_pk = :p AND s.state IN ('intent', 'unknown', "
                        "'accepted') GROUP BY s.item_pk HAVING count(*) > 1"
                    ),
                    pks,
                ).all()
                assert not open_subs, open_subs
                rows = conn.execute(
                    text(
                        "SELECT i.state, i.attempts, (SELECT count(*) FROM submissions s WHERE "
                        "s.item_pk = i.id), (SELECT count(*) FROM submissions s WHERE s.item_pk "
                        "= i.id AND s.state = 'succeeded'), (SELECT count(*) FROM cost_entries c "
                        "JOIN submissions s ON s.id = c.submission_pk WHERE s.item_pk = i.id), "
                        "i.claim_owner, i.lease_expires_at FROM items i WHERE i.episode_pk = :p"
                    ),
                    pks,
                ).all()
                failed_refs = set(
                    conn.execute(
                        text(
                            "SELECT s.client_reference FROM submissions s JOIN items i ON i.id "
                            "= s.item_pk WHERE i.episode_pk = :p AND s.state = 'failed'"
                        ),
                        pks,
                    ).scalars()
                )
            # A job the provider made is never recorded failed (its jobs do not fail here):
            # the next run would pay a second one.
            assert not failed_refs & set(self.jobs), failed_refs & set(self.jobs)
            for state, attempts, subs, succeeded, costs, owner, lease in rows:
                assert attempts == subs, (attempts, subs)  # every paid call counted once
                assert costs == succeeded <= 1, (costs, succeeded)
                assert (state == "completed") == (succeeded == 1), (state, succeeded)
                if state == "running":
                    assert owner is not None and lease is not None

    run_state_machine_as_test(
        Holders,
        settings=settings(
            max_examples=20,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
