"""The media store's identity, recorded on both sides: a marker in the store, a row in the
database.

A machine configured with the wrong store (a typo in the prefix, or EPISODIC_MEDIA_URL unset
on a worker that shares the database, which then writes to its own local folder) must never
read "wrong store" as "images lost": restore would buy again images that are safe, and paid
images would land in a folder that dies with its container. So the store holds a small
marker object, ``episodic-store.json`` at its root (``{"store_id": uuid, "created": ...}``),
and the database records the store it writes to (`media_store`: its store id and public URL).

`verify` runs before anything is read, bought or written: a recorded store whose marker the
configured store does not hold (missing or another's) is refused with `WrongMediaStore`
(exit 2), one line naming both stores. With nothing recorded yet, a command that writes
media (``adopt``) adopts the configured store: it writes the marker if the store has none
(put-if-absent) and records it with a guarded insert (one row at most), so two processes
racing adopt one store and the loser, had it another, is refused. A database that already
records completed images (one upgraded from before this table) adopts the store only if it
holds some of the first of them; otherwise the store is refused as the wrong one.

`move` is the one way to another store on purpose (`episodic media import --from URL`, after
it copied every recorded object): it replaces the row, guarded by the old store id.

A recorded store whose marker was deleted (its images all there) has one way back,
`restore_marker` (`episodic media restore-marker`): the configured store must be at the
recorded address and hold a sample of the recorded objects with their recorded sha256; then
the marker is written again with the recorded store id (put-if-absent), so every machine
sharing the database finds it as before. Until then, commands that only read and report
(`verify(read_only=True)`: `check`, `episodes show`, `preview`) go on at the recorded address
(every byte they read is checked against its recorded sha256 anyway); everything that writes
or buys is refused.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Engine, Table, select, update

from episodic.core.errors import (
    CommandNotAllowed,
    MediaMissing,
    MediaStoreMisconfigured,
    WrongMediaStore,
)
from episodic.core.settings import Settings
from episodic.core.states import ItemState
from episodic.storage import tx
from episodic.storage.base import utcnow
from episodic.storage.media import MARKER, MediaStore, not_a_marker
from episodic.storage.models import EpisodeMediaRow, ItemRow, MediaStoreRow

_store: Table = MediaStoreRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_media: Table = EpisodeMediaRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class RecordedStore:
    store_id: str
    url: str


def recorded(engine: Engine) -> RecordedStore | None:
    """The store this database records its media in, or None before any was adopted."""
    with tx.read(engine) as conn:
        row = conn.execute(select(_store.c.store_id, _store.c.url)).one_or_none()
    return None if row is None else RecordedStore(row.store_id, row.url)


def marker_id(store: MediaStore) -> str | None:
    """The store id in `store`'s marker, or None when it has none."""
    content = store.read_marker()
    if content is None:
        return None
    if not content.strip():
        raise not_a_marker(store.describe(), "it is empty")
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        raise not_a_marker(store.describe(), "it is not JSON") from None
    try:
        return str(uuid.UUID(str(body["store_id"])))
    except (ValueError, KeyError, TypeError):
        raise not_a_marker(store.describe(), "it holds no store id") from None


def ensure_marker(store: MediaStore) -> str:
    """The store's id, writing a new marker first if it has none (of racing writers, the
    first marker stays and every one of them reads it back)."""
    found = marker_id(store)
    if found is not None:
        return found
    body = {"store_id": str(uuid.uuid4()), "created": utcnow().isoformat()}
    store.write_marker(json.dumps(body, sort_keys=True).encode())
    written = marker_id(store)
    if written is None:
        raise MediaStoreMisconfigured(
            f"media store {store.describe()}: its {MARKER} vanished right after writing",
            url=store.describe(),
        )
    return written


def verify(
    engine: Engine, store: MediaStore, *, adopt: bool, read_only: bool = False
) -> RecordedStore | None:
    """Refuse (`WrongMediaStore`) a store that is not the recorded one; with nothing
    recorded and ``adopt``, record this one (module docstring). ``read_only``: a command
    that only reads and reports goes on at the recorded address when the marker is missing
    (`marker_missing` says so). Returns the recorded store (None: nothing recorded and not
    adopting)."""
    have = recorded(engine)
    if have is not None:
        mine = marker_id(store)
        if mine is None and read_only and store.describe() == have.url:
            return have
        if mine != have.store_id:
            raise _wrong(store, have, mine)
        return have
    if not adopt:
        return None
    samples = recorded_keys(engine)
    if samples and not any(store.exists(key) for key in samples):
        raise WrongMediaStore(
            f"media store {store.describe()} does not hold this database's images (none of "
            f"the first {len(samples)} recorded, such as {samples[0]}): set "
            "EPISODIC_MEDIA_URL to the store that holds them; nothing was bought",
            url=store.describe(),
        )
    mine = ensure_marker(store)
    with tx.write(engine) as conn:
        conn.execute(
            tx.insert_for(conn, _store)
            .values(singleton=1, store_id=mine, url=store.describe(), recorded_at=utcnow())
            .on_conflict_do_nothing(index_elements=["singleton"])
        )
    have = recorded(engine)
    if have is None or have.store_id != mine:  # another process adopted another store
        raise _wrong(store, have or RecordedStore("", "?"), mine)
    return have


def move(engine: Engine, old: RecordedStore, new: MediaStore) -> RecordedStore:
    """Record `new` (marked first) instead of `old`, guarded by old's id; refused when the
    row changed meanwhile."""
    mine = ensure_marker(new)
    with tx.write(engine) as conn:
        moved = conn.execute(
            update(_store)
            .where(_store.c.singleton == 1, _store.c.store_id == old.store_id)
            .values(store_id=mine, url=new.describe(), recorded_at=utcnow())
        ).rowcount
    if moved != 1:
        raise WrongMediaStore(
            f"the recorded media store changed while copying from {old.url}: nothing was "
            "recorded; run the import again",
            url=new.describe(),
        )
    return RecordedStore(mine, new.describe())


def recorded_keys(engine: Engine, limit: int = 5) -> list[str]:
    """The store keys of the first `limit` completed images (else episode media) the
    database records: a sample a store that holds its images holds some of."""
    with tx.read(engine) as conn:
        found = conn.execute(
            select(_items.c.output_key)
            .where(_items.c.state == ItemState.COMPLETED, _items.c.output_key.is_not(None))
            .order_by(_items.c.id)
            .limit(limit)
        ).scalars()
        keys = [str(key) for key in found]
        if not keys:
            media = select(_media.c.key).where(_media.c.key.is_not(None))
            keys = [
                str(k) for k in conn.execute(media.order_by(_media.c.id).limit(limit)).scalars()
            ]
    return keys


def _wrong(store: MediaStore, have: RecordedStore, mine: str | None) -> WrongMediaStore:
    """The refusal of `store` (its marker's id `mine`, None: no marker) by a database that
    records `have`, naming each store once and the command that can work."""
    here = store.describe()
    if mine is None and here == have.url:
        text = (
            f"media store {here} is this database's recorded store, but its marker {MARKER} "
            "is missing: if it still holds this database's images, `episodic media "
            "restore-marker` checks a sample of them and writes the marker again"
        )
    elif here == have.url:
        text = (
            f"media store {here} holds another store's {MARKER}: it is not the store this "
            "database recorded at that address; set EPISODIC_MEDIA_URL to the store that "
            "holds this database's images"
        )
    else:
        what = "has no marker" if mine is None else "holds another store's marker"
        text = (
            f"the configured media store {here} is not this database's recorded store "
            f"{have.url} (it {what} {MARKER}): set EPISODIC_MEDIA_URL to the recorded one, "
            f"or move on purpose with `episodic media import --from {have.url}`"
        )
    return WrongMediaStore(f"{text}; nothing was bought", url=here)


def marker_missing(engine: Engine, store: MediaStore) -> bool:
    """True when `store` is at the recorded store's address and has no marker (a read-only
    command went on: `verify`)."""
    have = recorded(engine)
    return have is not None and store.describe() == have.url and marker_id(store) is None


@dataclass
class MarkerReport:
    """What `restore_marker` checked: the store, how many objects the database records, the
    keys it sampled, the problems found (key, why), and whether the marker was written
    (False with no problem: it was already there)."""

    store: str
    recorded: int
    sampled: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    written: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "recorded_objects": self.recorded,
            "sampled": len(self.sampled),
            "problems": [{"key": key, "problem": why} for key, why in self.problems],
            "written": self.written,
        }


def sample_of(objects: list[tuple[str, str, str]], size: int) -> list[tuple[str, str, str]]:
    """Up to `size` of `objects`, spread evenly from the first to the last (deterministic:
    the same database samples the same keys)."""
    if len(objects) <= size:
        return list(objects)
    if size == 1:
        return [objects[0]]
    step = (len(objects) - 1) / (size - 1)
    return [objects[round(n * step)] for n in range(size)]


def restore_marker(engine: Engine, store: MediaStore, sample: int) -> MarkerReport:
    """Write the recorded store's marker again in `store` (module docstring) once a sample
    of `sample` recorded objects was found there with its recorded sha256. Refused
    (`CommandNotAllowed`, exit 2, nothing written) when nothing is recorded, `store` is not
    at the recorded address, or holds another store's marker; a sample that does not match
    is reported (`problems`) and nothing is written."""
    have = recorded(engine)
    if have is None:
        raise CommandNotAllowed(
            "this database records no media store yet: there is no marker to restore (the "
            "next command that stores media adopts the configured store)"
        )
    here = store.describe()
    if here != have.url:
        raise CommandNotAllowed(
            f"the configured media store {here} is not this database's recorded store "
            f"{have.url}: set EPISODIC_MEDIA_URL={have.url} to restore its marker; nothing "
            "was written"
        )
    mine = marker_id(store)
    objects = recorded_objects(engine)
    report = MarkerReport(here, len(objects))
    if mine == have.store_id:
        return report  # already there: nothing to do
    if mine is not None:
        raise _wrong(store, have, mine)
    for key, sha256, _media_type in sample_of(objects, sample):
        report.sampled.append(key)
        try:
            held = store.read(key)
        except MediaMissing:
            report.problems.append((key, "missing"))
            continue
        if hashlib.sha256(held).hexdigest() != sha256:
            report.problems.append((key, "its bytes are not the recorded ones"))
    if report.problems:
        return report
    body = {"store_id": have.store_id, "created": utcnow().isoformat(), "restored": True}
    store.write_marker(json.dumps(body, sort_keys=True).encode())
    if marker_id(store) != have.store_id:  # another marker was written meanwhile
        raise _wrong(store, have, marker_id(store))
    report.written = True
    return report


def recorded_objects(engine: Engine) -> list[tuple[str, str, str]]:
    """Every object the database records in its store, once each: (key, sha256, media type)
    of the completed images and of the episodes' covers and manifests."""
    with tx.read(engine) as conn:
        images = conn.execute(
            select(_items.c.output_key, _items.c.output_sha256, _items.c.output_media_type)
            .where(_items.c.output_key.is_not(None))
            .order_by(_items.c.id)
        ).all()
        media = conn.execute(
            select(_media.c.key, _media.c.sha256, _media.c.media_type)
            .where(_media.c.key.is_not(None))
            .order_by(_media.c.id)
        ).all()
    found: dict[str, tuple[str, str, str]] = {}
    for key, sha256, media_type in (*images, *media):
        found.setdefault(str(key), (str(key), str(sha256), str(media_type)))
    return list(found.values())


def open_verified(settings: Settings, engine: Engine, *, adopt: bool = False) -> MediaStore:
    """The store `settings` name, refused (`WrongMediaStore`) unless it is the recorded one
    (``adopt``: a command that writes media records it when nothing is recorded yet)."""
    store = MediaStore.from_settings(settings)
    verify(engine, store, adopt=adopt)
    return store
