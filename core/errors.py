"""Domain errors, each carrying the exit code the CLI maps it to.

The tree::

    EpisodicError                       exit 1  (unexpected / generic)
    ├── InvalidInput                    exit 2  bad input, refused before any work
    │   ├── InvalidEpisodeId
    │   ├── InvalidWeekId
    │   └── NoInvocationIdentity        no flow run to derive an allocation key from
    │   ├── BudgetExceeded              the plan would spend more than allowed
    │   ├── InvalidPlaylist
    │   ├── CommandNotAllowed           the episode's state forbids the command
    │   │   └── ImageNotAsPaid          an image file changed or vanished since it was paid for
    │   └── IdempotencyKeyReused        an explicit key sent again with other parameters
    ├── AllocationConflict              exit 3  fail closed, nothing written
    ├── EpisodeNotFound                 exit 5
    ├── RunNotFound                     exit 5
    ├── InvalidTransition               exit 2  a state change its machine forbids (core.states)
    ├── ProviderConfigError             exit 2  unknown profile, missing credential
    ├── StorageError                    exit 1
    │   ├── SchemaNotCurrent            database needs `episodic db upgrade`
    │   └── MediaStoreError             the media store (`transient`: collect again later)
    │       ├── MediaStoreUnavailable   transient: outage, 5xx, timeout, full disk
    │       ├── MediaStoreMisconfigured exit 2: no such bucket or folder, access denied,
    │       │   │                       wrong credentials, the URL's package not installed
    │       │   └── WrongMediaStore     exit 2: not the store the database records
    │       ├── MediaMissing            no object under the key
    │       └── MediaCorrupt            the object under a content key holds other bytes
    └── NotAnImage                      exit 1  downloaded bytes that are not a PNG/JPEG/WEBP

Errors are mapped to exit codes in one place (`exit_code` on the class); the CLI prints
`str(error)` as its one-line reason. Messages never contain credentials.
"""

from __future__ import annotations

from episodic.core.exit_codes import ExitCode


class EpisodicError(Exception):
    """Base class of every error this project raises on purpose."""

    exit_code: ExitCode = ExitCode.ERROR


class InvalidInput(EpisodicError, ValueError):
    exit_code = ExitCode.REFUSED


class InvalidEpisodeId(InvalidInput):
    pass


class InvalidWeekId(InvalidInput):
    pass


class NoInvocationIdentity(InvalidInput):
    """An allocation key was requested outside a flow run and none was given explicitly."""


class AllocationConflict(EpisodicError):
    exit_code = ExitCode.ALLOCATION_CONFLICT


def _looked_in(database: str | None) -> str:
    return f" (database: {database})" if database else ""


class EpisodeNotFound(EpisodicError, LookupError):
    """No such episode in the pipeline. ``database`` names where it was looked for (a SQLite
    file's path, or a URL without its password: `episodic.storage.engine.database_label`), so a
    command started with another state folder or URL says which one it read."""

    exit_code = ExitCode.NOT_FOUND

    def __init__(self, pipeline: str, episode_id: str, database: str | None = None) -> None:
        super().__init__(
            f"episode {episode_id} not found in pipeline {pipeline!r}{_looked_in(database)}"
        )
        self.pipeline = pipeline
        self.episode_id = episode_id
        self.database = database

    def __reduce__(self) -> tuple[type, tuple[str, str, str | None]]:
        return (type(self), (self.pipeline, self.episode_id, self.database))


class StorageError(EpisodicError):
    pass


class SchemaNotCurrent(StorageError):
    pass


class MigrationRefused(StorageError):
    """An upgrade found rows the new schema would refuse: it says which (one line) and
    changes nothing; the rows are mended and the upgrade run again."""

    exit_code = ExitCode.REFUSED


class MediaStoreError(StorageError):
    """The media store failed. ``transient`` says whether the same call may succeed later
    (an outage, a 5xx, a timeout, a full disk: the caller leaves the item accepted and
    collects again) or needs a person (configuration). ``url`` is the store's URL without
    credentials; messages name it and never a credential."""

    transient: bool = False

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class MediaStoreUnavailable(MediaStoreError):
    transient = True


class MediaStoreMisconfigured(MediaStoreError):
    """The store cannot be used as configured: refused before any work (exit 2)."""

    exit_code = ExitCode.REFUSED


class WrongMediaStore(MediaStoreMisconfigured):
    """The configured store is not the one this database records its media in (its marker
    is missing or another's): refused before anything is read, bought or written (exit 2)."""


class MediaMissing(MediaStoreError, LookupError):
    def __init__(self, key: str, *, url: str) -> None:
        super().__init__(f"{key} is not in the media store {url}", url=url)
        self.key = key


class MediaCorrupt(MediaStoreError):
    """The object under a content key does not hash to its key: the store was written
    behind our back. Never overwritten unless the caller repairs on purpose."""

    def __init__(self, key: str, detail: str, *, url: str) -> None:
        super().__init__(f"{key} in the media store {url}: {detail}", url=url)
        self.key = key


class NotAnImage(EpisodicError):
    """Bytes that do not decode in full as a PNG, JPEG or WEBP image. ``reason`` is short
    and never echoes the bytes."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"not an image: {reason}")
        self.reason = reason


class BudgetExceeded(InvalidInput):
    pass


class InvalidPlaylist(InvalidInput):
    pass


class PlaylistMistakes(InvalidPlaylist):
    """Every mistake of one playlist: `header` (`playlist FILE: 3 mistakes:`) and one line
    per mistake. Its text is one line (logs, Prefect); the CLI prints several mistakes one
    a line under the header (one mistake: its one line)."""

    def __init__(self, source: str, mistakes: list[str]) -> None:
        count = "1 mistake" if len(mistakes) == 1 else f"{len(mistakes)} mistakes"
        self.header = f"playlist {source}: {count}:"
        self.mistakes = mistakes
        one = len(mistakes) == 1
        super().__init__(
            f"playlist {source}: {mistakes[0]}" if one else f"{self.header} {'; '.join(mistakes)}"
        )


class CommandNotAllowed(InvalidInput):
    pass


class ImagesChangedSinceShown(CommandNotAllowed):
    """A decision bound to the images a reviewer was shown (their digest) found the plan or
    an image changed since: nothing was recorded, and the reviewer is asked again."""


class ImageNotAsPaid(CommandNotAllowed):
    """An image file is missing or its bytes differ from the sha256 the ledger recorded when
    it was paid for: nothing is approved or assembled from it (exit 2, nothing written)."""


class IdempotencyKeyReused(InvalidInput):
    """An explicit idempotency key was sent again with different parameters (as in Stripe's
    API and the IETF Idempotency-Key draft: an error, never a silent second run)."""

    def __init__(self, key: str, run_id: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was used for run {run_id} with different parameters; "
            "use a new key for a different request"
        )
        self.key = key
        self.run_id = run_id


class RunNotFound(EpisodicError, LookupError):
    """No such run; ``database`` names where it was looked for (as `EpisodeNotFound`)."""

    exit_code = ExitCode.NOT_FOUND

    def __init__(self, run_id: str, database: str | None = None) -> None:
        super().__init__(f"run {run_id} not found{_looked_in(database)}")
        self.run_id = run_id
        self.database = database

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return (type(self), (self.run_id, self.database))


class InvalidTransition(EpisodicError):
    exit_code = ExitCode.REFUSED


class ProviderConfigError(EpisodicError):
    exit_code = ExitCode.REFUSED


class TimezoneMismatch(InvalidInput):
    """This process's EPISODIC_TIMEZONE disagrees with the timezone recorded for the pipeline:
    it would compute other weeks than every other worker, so it refuses before allocating."""

    def __init__(self, pipeline: str, recorded: str, configured: str) -> None:
        super().__init__(
            f"pipeline {pipeline} runs in {recorded} (recorded in the database), but this "
            f"process has EPISODIC_TIMEZONE={configured}: unset it or set it to {recorded} "
            "(to move the pipeline, change its recorded timezone explicitly)"
        )
        self.pipeline = pipeline
        self.recorded = recorded
        self.configured = configured


class ScheduleOutOfDate(InvalidInput):
    """A scheduled run whose deployment's schedule is in another timezone than the one the
    pipeline records (changed without redeploying): its slot would land in the wrong week."""


def frozen_plan(episode_id: str, state: str) -> CommandNotAllowed:
    """The refusal of any change to an approved or assembled episode's plan (exit 2)."""
    return CommandNotAllowed(
        f"episode {episode_id} is {state}: its plan is frozen (what was approved is what "
        f"ships); `episodic reopen {episode_id} --reason TEXT --by NAME` first"
    )
