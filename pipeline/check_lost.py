"""`episodic check`'s finding for a paid job whose output the provider deleted before it
was collected (`pipeline.gone` recorded it lost, its submission failed with its charge) while
its item is still not completed: what it cost and the one command that buys it again. Once
`media restore --buy-again` completes the item, nothing is found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from episodic.core.money import format_money
from episodic.core.playlist import item_label
from episodic.core.states import ItemState, SubmissionState
from episodic.storage.audit import CostRecord, EpisodeRecord, ItemRecord, SubmissionRecord


def check_lost_at_provider(
    add: Any,
    episode: EpisodeRecord,
    items: Sequence[ItemRecord],
    subs: Sequence[SubmissionRecord],
    costs: Sequence[CostRecord],
) -> None:
    """A paid job whose output the provider deleted before it was collected (recorded lost,
    its submission failed with its charge) while its item is still not completed: what it
    cost and the one command that buys it again."""
    open_items = {item.id: item for item in items if item.state != ItemState.COMPLETED}
    paid = Counter[int]()
    currency: dict[int, str] = {}
    for cost in costs:
        paid[cost.submission_pk] += cost.amount_micros
        currency[cost.submission_pk] = cost.currency
    for sub in subs:
        item = open_items.get(sub.item_pk)
        if item is None or not sub.output_lost or sub.state != SubmissionState.FAILED:
            continue
        label = item_label(item.video_id, item.part, item.candidate)
        spent = format_money(paid[sub.id], currency.get(sub.id, "USD"))
        add(
            "lost-output",
            f"item {label}: provider job {sub.remote_ref} was paid ({spent}) but its "
            "output was deleted at the provider before it was collected; buy it again with "
            f"`episodic media restore {episode.episode_id} --pipeline {episode.pipeline} "
            "--buy-again`",
        )
