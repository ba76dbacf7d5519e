"""The fault suite's own counts, taken where the work is done and never from the product's
view of it: provider jobs from the fake provider's own files and log (the local HTTP
server counts its own), episodes, items, runs, submissions and the ledger from the database
in plain SQL of this module.

These encodings are **independent of the product's predicates on purpose**: nothing here
imports `storage` or `pipeline` (no "held by a live claim", no "open submission", no state
group of `episodic.core.states`). An auditor that shares a predicate with the code it audits is
blind to a bug in it: a wrong predicate would make the product and its audit agree.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, text


@dataclass
class AllocationAudit:
    """What the database holds of the allocations reported to callers."""

    reported: int  # allocations reported to callers (key -> episode id)
    kept: int  # of those, the ones in the database as reported
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.reported - self.kept


def audit_allocations(engine: Engine, reported: list[tuple[str, str]]) -> AllocationAudit:
    """No key owns two episodes, sequences have no gap or duplicate, no partial episode, and
    every allocation reported to a caller (key, episode id) is in the database as reported."""
    problems: list[str] = []
    with engine.connect() as conn:
        dupes = conn.execute(
            text(
                "SELECT allocation_key FROM episodes GROUP BY pipeline, allocation_key "
                "HAVING count(*) > 1"
            )
        ).all()
        rows = conn.execute(
            text("SELECT week_id, sequence FROM episodes ORDER BY week_id, sequence")
        ).all()
        partial = conn.execute(
            text(
                "SELECT count(*) FROM episodes e WHERE NOT EXISTS (SELECT 1 FROM "
                "episode_events v WHERE v.episode_pk = e.id AND v.kind = 'allocated')"
            )
        ).scalar_one()
    if dupes:
        problems.append(f"{len(dupes)} keys own several episodes, e.g. {dupes[0][0]}")
    weeks: dict[str, list[int]] = {}
    for week, sequence in rows:
        weeks.setdefault(week, []).append(sequence)
    for week, sequences in weeks.items():
        if sequences != list(range(len(sequences))):
            problems.append(f"{week}: sequences are not 0..{len(sequences) - 1} without gaps")
    if partial:
        problems.append(f"{partial} episodes without their allocation event (partial)")
    with engine.connect() as conn:
        stored = dict(
            conn.execute(text("SELECT allocation_key, episode_id FROM episodes")).tuples().all()
        )
    lost = [key for key, episode_id in reported if stored.get(key) != episode_id]
    if lost:
        problems.append(f"{len(lost)} reported allocations are not in the database, e.g. {lost[0]}")
    return AllocationAudit(len(reported), len(reported) - len(lost), problems)


def jobs_per_item(home: Path) -> Counter[str]:
    """Jobs per item as the fake provider holds them: one file per job it made, in its own
    state folder under `home`, mapped to items by the `submit` its log records first. Not its
    `job_created` log lines: a SIGKILL can land between a job's creation and that line (the
    fake provider runs in the killed process), and the count would miss a job that exists."""
    from episodic.providers.fake import jobs_folder

    log, jobs = home / "provider.jsonl", jobs_folder(home)  # EPISODIC_FAKE_PROVIDER_DIR
    if not log.exists():
        return Counter()
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    item_of = {e["client_reference"]: e["item_id"] for e in events if e["event"] == "submit"}
    made = [json.loads(path.read_text())["client_reference"] for path in jobs.glob("*.json")]
    return Counter(item_of.get(reference, f"unknown:{reference}") for reference in made)


def leftovers(
    engine: Engine,
    episode_id: str,
    *,
    unknown_is_stuck: bool = True,
    media_root: Path | None = None,
) -> tuple[int, int, int]:
    """(items not completed, runs/items/submissions left running or open, completed items
    whose image is missing or no longer matches its recorded SHA-256) of an episode. With
    `unknown_is_stuck` False, a submission left "acceptance unknown" for an operator (by
    design, for a provider that can only look jobs up) is not counted as stuck.
    `media_root`: the local media store folder the images' keys are read in (default: this
    environment's store, `EPISODIC_MEDIA_URL` or ``$EPISODIC_HOME/media``); the file is
    read here directly, not through the store's code."""
    open_states = (
        "('intent', 'unknown', 'accepted')" if unknown_is_stuck else "('intent', 'accepted')"
    )
    with engine.connect() as conn:
        pk = conn.execute(
            text("SELECT id FROM episodes WHERE episode_id = :e"), {"e": episode_id}
        ).scalar_one()
        unfinished = conn.execute(
            text("SELECT count(*) FROM items WHERE episode_pk = :p AND state != 'completed'"),
            {"p": pk},
        ).scalar_one()
        stuck = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM runs WHERE episode_pk = :p AND state IN "
                "('running', 'pending')) + (SELECT count(*) FROM items WHERE episode_pk = :p "
                "AND state = 'running') + (SELECT count(*) FROM submissions s JOIN items i ON "
                f"i.id = s.item_pk WHERE i.episode_pk = :p AND s.state IN {open_states})"
            ),
            {"p": pk},
        ).scalar_one()
        outputs = conn.execute(
            text(
                "SELECT output_key, output_path, output_sha256 FROM items WHERE "
                "episode_pk = :p AND state = 'completed'"
            ),
            {"p": pk},
        ).all()
    if media_root is None:
        from episodic.core.settings import load_settings

        media_root = Path(load_settings().media_store_url)
    lost = sum(
        1
        for key, path, sha in outputs
        if sha256_of(str(media_root.joinpath(*key.split("/"))) if key else path) != sha
    )
    return int(unfinished), int(stuck), lost


def sha256_of(path: str | None) -> str | None:
    """The file's SHA-256 (hex), or None when there is no such file."""
    try:
        return hashlib.sha256(Path(path or "").read_bytes()).hexdigest()
    except OSError:
        return None


def ledger_rows(engine: Engine, episode_id: str) -> str:
    """The episode's items and submissions, one line each (for a failed trial's forensics)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.video_id, i.state, i.attempts, i.claim_owner, i.error_text, s.attempt, "
                "s.state, s.remote_ref, s.error_text FROM items i JOIN episodes e ON e.id = "
                "i.episode_pk LEFT JOIN submissions s ON s.item_pk = i.id WHERE e.episode_id = "
                ":e ORDER BY i.video_id, s.attempt"
            ),
            {"e": episode_id},
        ).all()
        runs = conn.execute(
            text(
                "SELECT r.id, r.state, r.error_text FROM runs r JOIN episodes e ON e.id = "
                "r.episode_pk WHERE e.episode_id = :e"
            ),
            {"e": episode_id},
        ).all()
    return "\n".join(str(tuple(r)) for r in [*runs, *rows])


def unfinished_items(engine: Engine, key: str) -> list[tuple[str, str | None, str]]:
    """(prompt, error, item key) of the items of the episode of allocation key `key` not
    completed."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.prompt, i.error_text, i.idempotency_key FROM items i JOIN episodes e "
                "ON e.id = i.episode_pk WHERE e.allocation_key = :k AND i.state != 'completed'"
            ),
            {"k": key},
        ).all()
    return [(str(prompt), error, str(item_key)) for prompt, error, item_key in rows]


def episode_of(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT episode_id FROM episodes WHERE allocation_key = :k"), {"k": key}
            ).scalar_one()
        )


def episode_cost(engine: Engine, key: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(c.amount_micros), 0) FROM cost_entries c JOIN episodes e "
                    "ON e.id = c.episode_pk WHERE e.allocation_key = :k"
                ),
                {"k": key},
            ).scalar_one()
        )
