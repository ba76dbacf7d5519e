"""The media store: paid bytes under content-addressed keys, in a local folder or a bucket.

One URL names the store (`EPISODIC_MEDIA_URL`): a plain path or ``file://`` URL is a local
folder; ``s3://bucket/prefix`` is S3 or any S3-compatible server (MinIO, R2, GCS interop),
through s3fs; ``gs://`` and ``az://`` (``abfs://``) work when gcsfs or adlfs is installed.
S3's endpoint, credentials and region are read by botocore itself from the AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, or a profile); the URL never carries a credential.

Every write is put-if-absent under ``episodic.core.media.content_key`` (sha256 + the proven media
type): the same key holds the same bytes by construction, so concurrent writers of one image
leave one intact object and nothing ever overwrites other bytes. Before it answers, the store
proves that it holds exactly those bytes: a `StoredMedia` is bytes the store verifiably
holds. S3 proves it itself where it checks the SHA-256 a write carries
(`episodic.storage.media_backends.RemoteBackend`); any other store, and any object S3 cannot
vouch for, is re-read and its size and sha256 checked. A local folder writes to a temporary
file in the target's directory, fsyncs it, links it into place (which fails if the key
exists) and fsyncs the directory; a failure removes the temporary file.

Errors are `episodic.core.errors.MediaStoreError`s that say whether trying again may help
(`MediaStoreUnavailable`: outage, 5xx, timeout, full disk) or not
(`MediaStoreMisconfigured`: no such bucket or folder, access denied, wrong credentials).
Their messages name the store by `describe()` and never by a credential.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from episodic.core.errors import (
    InvalidInput,
    MediaCorrupt,
    MediaMissing,
    MediaStoreError,
    MediaStoreMisconfigured,
    MediaStoreUnavailable,
)
from episodic.core.home import anchored, has_control_character, mark_state_folder
from episodic.core.media import (
    DOCUMENT_TYPES,
    MediaProblem,
    ProvenImage,
    StoredMedia,
    content_key,
    content_problem,
    parse_store_url,
    validate_key,
)
from episodic.core.output_files import RecordPaths, write_output
from episodic.core.settings import Settings
from episodic.storage.media_backends import (
    Backend,
    LocalBackend,
    RemoteBackend,
)

_T = TypeVar("_T")
# Object-store schemes, and the package each needs when it is not installed.
_REMOTE = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
_REMOTE |= {"az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}
_CONTAINER_SCHEMES = frozenset({"az", "abfs", "abfss"})
_PROBE_DIR = ".probe"
MARKER = "episodic-store.json"  # the store's identity (storage.store_identity), at its root


def not_a_marker(url: str, what: str) -> MediaStoreMisconfigured:
    """The refusal of a store whose `MARKER` is not one (`what` it is instead): one line with
    the way on, which never deletes what is there."""
    return MediaStoreMisconfigured(
        f"media store {url}: its {MARKER} is not a store marker ({what}): move it out of "
        "the store (episodic never deletes what it did not write); then `episodic media "
        "restore-marker` checks a sample of this database's images and writes the marker "
        "again",
        url=url,
    )


def public_url(url: str) -> str:
    """`url` as messages may show it: no password, query, fragment or control character,
    and a user part only where it names a container (``az://container@account``)."""
    shown = "".join("?" if has_control_character(char) else char for char in url)
    parts = urlsplit(shown)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive)
        return shown
    user, _, host = parts.netloc.rpartition("@")
    user = user.split(":", 1)[0]
    netloc = f"{user}@{host}" if user and parts.scheme.lower() in _CONTAINER_SCHEMES else host
    return f"{parts.scheme}://{netloc}{parts.path}"


class MediaStore:
    """A media store opened from one URL (`open`, `from_settings`); thread-safe.

    ``timeout_s`` bounds each network connect and read of a remote store; ``attempts`` is
    how many times one call is tried before a transient error is raised (local folders
    ignore both).
    """

    def __init__(self, url: str, backend: Backend, options: tuple[float, int]) -> None:
        self._url = public_url(url)
        self._backend = backend
        self._options = options

    def __reduce__(self) -> tuple[object, tuple[str, bool, float, int]]:
        """Pickled as its URL and options (a process pool or a Dask worker reopens it with
        its own client and credentials); a local store's folder exists by then."""
        return (_reopen, (self._url, False, *self._options))

    @classmethod
    def open(
        cls, url: str, *, create: bool = False, timeout_s: float = 20.0, attempts: int = 3
    ) -> MediaStore:
        """The store at `url`. ``create``: make a local folder (and its parents) if missing
        (the default store inside the state folder); otherwise a missing folder is refused
        at `probe` and `check_root`. A relative folder is the project's, as a relative
        ``EPISODIC_HOME`` (`episodic.core.home.anchored`), never the working directory's. Raises
        InvalidInput for a URL that names no store unambiguously (`parse_store_url`), and
        MediaStoreMisconfigured for an unknown scheme or a scheme whose package is not
        installed."""
        parsed = parse_store_url(url)
        shown = public_url(url)
        scheme = parsed.scheme
        if not scheme:
            root = anchored(Path(parsed.path))
            if create:
                _mkdirs(root, shown)
            return cls(str(root), LocalBackend(root, str(root)), (timeout_s, attempts))
        if scheme not in _REMOTE:
            raise MediaStoreMisconfigured(
                f"media store {shown}: unsupported scheme {scheme}:// "
                "(use a folder, file://, s3://, gs:// or az://)",
                url=shown,
            )
        if not parsed.netloc:
            raise MediaStoreMisconfigured(f"media store {shown}: no bucket in the URL", url=shown)
        try:
            import fsspec  # type: ignore[import-untyped]

            fsspec.get_filesystem_class(scheme)
        except (ImportError, ValueError):
            raise MediaStoreMisconfigured(
                f"media store {shown} needs the package {_REMOTE[scheme]} "
                f"(pip install {_REMOTE[scheme]})",
                url=shown,
            ) from None
        prefix = f"{parsed.netloc}/{parsed.prefix}".rstrip("/")
        backend = RemoteBackend(scheme, prefix, shown, timeout_s, attempts)
        return cls(url, backend, (timeout_s, attempts))

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaStore:
        """The store `settings` names (EPISODIC_MEDIA_URL, default: ``<home>/media``, which
        is created on first use, in the state folder `core.home.mark_state_folder` makes)."""
        if settings.media_url is None:
            mark_state_folder(settings.home_path)
        return cls.open(settings.media_store_url, create=settings.media_url is None)

    def check_root(self) -> None:
        """Raise MediaStoreMisconfigured (one line, exit 2) when a local store's folder does
        not exist or is not a folder: every image would read as missing from it. (A bucket
        answers for itself at the first request.)"""
        self._backend.check_root()

    def describe(self) -> str:
        """The store's URL (a local store: its absolute folder) with no credentials."""
        return self._url

    def put_image(self, image: ProvenImage, *, repair: bool = False) -> StoredMedia:
        """Store proven image bytes under their content key and verify them (see `_put`)."""
        if hashlib.sha256(image.content).hexdigest() != image.sha256:
            raise InvalidInput("a ProvenImage whose sha256 is not its content's")
        return self._put(image.content, image.media_type, image.width, image.height, repair)

    def put_document(
        self, content: bytes, *, media_type: str = "application/json", repair: bool = False
    ) -> StoredMedia:
        """Store a document (an episode's manifest) under its content key and verify it.
        Images go through `put_image`: only proven bytes are stored as images."""
        if media_type not in DOCUMENT_TYPES:
            raise InvalidInput(f"{media_type} is not a document type; images use put_image")
        return self._put(content, media_type, None, None, repair)

    def _put(
        self, content: bytes, media_type: str, width: int | None, height: int | None, repair: bool
    ) -> StoredMedia:
        """Write-if-absent, then verify what the store holds: proven by the store itself
        (`Backend.write_proven`) or re-read (size and sha256).

        An existing object with the same bytes is kept as it is (another writer or an
        earlier run stored it). One with other bytes is a tampered or damaged object: raises
        MediaCorrupt and leaves it, unless ``repair`` replaces it with these bytes.
        """
        sha256 = hashlib.sha256(content).hexdigest()
        key = content_key(sha256, media_type)
        write = lambda: self._backend.write_proven(key, content, media_type, sha256)  # noqa: E731
        created, proven = self._call(write, key)
        problem = None if proven else self.verify(key, sha256, len(content))
        if problem is not None and problem.kind != "missing" and not created and repair:
            self._call(lambda: self._backend.replace(key, content, media_type), key)
            problem = self.verify(key, sha256, len(content))
        if problem is not None:
            if problem.kind == "missing":  # written, then gone: the store lost it
                raise MediaStoreUnavailable(
                    f"{key} vanished from the media store {self._url} right after writing",
                    url=self._url,
                )
            raise MediaCorrupt(key, problem.detail, url=self._url)
        return StoredMedia(key, sha256, len(content), media_type, width, height)

    def read(self, key: str) -> bytes:
        """The bytes under `key`. Raises MediaMissing when there is no such object."""
        validate_key(key)
        return self._call(lambda: self._backend.read(key), key)

    def exists(self, key: str) -> bool:
        validate_key(key)
        return self._call(lambda: self._backend.exists(key), key)

    def verify(self, key: str, sha256: str, size: int) -> MediaProblem | None:
        """None when the store holds exactly `size` bytes hashing to `sha256` under `key`
        (re-read in full: the recorded sha256 is what was paid for, and no store's own
        checksum is that hash everywhere); otherwise the problem. A store that cannot
        answer raises (an outage is not a finding about the object)."""
        try:
            held = self.read(key)
        except MediaMissing:
            return MediaProblem(key, "missing", f"missing from the media store {self._url}")
        return content_problem(key, held, sha256, size)

    def probe(self) -> None:
        """Write, read back and delete a small probe object: proof, before any money is
        spent, that this process can store media here. Raises MediaStoreMisconfigured (no
        such folder or bucket, access denied, wrong credentials) or MediaStoreUnavailable,
        each one line naming `describe()`."""
        key = f"{_PROBE_DIR}/{uuid.uuid4().hex}"
        body = f"episodic media store probe {key}".encode()
        self._backend.check_root()
        self._call(lambda: self._backend.write_new(key, body, "text/plain"), key, "write")
        if self._call(lambda: self._backend.read(key), key, "read") != body:
            raise MediaStoreUnavailable(
                f"media store {self._url} returned other bytes for a probe just written",
                url=self._url,
            )
        # A store that lets us write but not delete still keeps what we pay for.
        with contextlib.suppress(MediaStoreMisconfigured):
            self._call(lambda: self._backend.delete(key), key, "delete")

    def read_marker(self) -> bytes | None:
        """The store's marker object (`MARKER`), or None when it has none. A store that
        cannot answer raises (MediaStoreMisconfigured for a missing folder or bucket, or a
        folder where the marker would be: `not_a_marker`)."""
        self._backend.check_root()
        try:
            return self._call(lambda: self._backend.read(MARKER), MARKER, "read")
        except MediaMissing:
            if self._backend.occupied(MARKER):
                raise not_a_marker(self.describe(), "a folder or a special file") from None
            return None

    def write_marker(self, content: bytes) -> bool:
        """Write the marker unless the store has one (put-if-absent: of two racing writers
        one wins); True if this call wrote it."""
        self._backend.check_root()
        write = lambda: self._backend.write_new(MARKER, content, "application/json")  # noqa: E731
        return self._call(write, MARKER, "write")

    def local_copy(
        self, key: str, dest: Path, *, keep: RecordPaths, sha256: str | None = None
    ) -> Path:
        """Copy the object under `key` to the file `dest` (atomically: temporary file, fsync,
        rename; a `dest` that is not a regular file is refused, InvalidInput), checking it
        against `sha256` when given (MediaCorrupt if it differs). Returns `dest`.
        For ``--out DIR``: a local copy, the store stays the record, and `dest` is never a
        part of it (`keep`: the ledger, the state folder, this store...: InvalidInput)."""
        content = self.read(key)
        if sha256 is not None and hashlib.sha256(content).hexdigest() != sha256:
            raise MediaCorrupt(key, "its bytes differ from the recorded sha256", url=self._url)
        dest = Path(dest)
        write_output(dest, content, f"cannot write {dest}", keep=keep)  # nor a link, device
        return dest

    def _call(self, op: Callable[[], _T], key: str, action: str = "") -> _T:
        try:
            return op()
        except MediaStoreError:
            raise
        except Exception as exc:  # the backends' own errors, classified once here
            raise self._backend.classify(exc, key, action) from None


def _mkdirs(root: Path, shown: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MediaStoreMisconfigured(
            f"media store {shown} cannot be created: {exc.strerror or type(exc).__name__}",
            url=shown,
        ) from None


def _reopen(url: str, create: bool, timeout_s: float, attempts: int) -> MediaStore:
    return MediaStore.open(url, create=create, timeout_s=timeout_s, attempts=attempts)
