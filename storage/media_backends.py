"""The media store's backends: a local folder, and object stores through fsspec.

`episodic.storage.media.MediaStore` is the one user; each backend lets its library's errors escape
and maps them once in `classify` (transient or configuration, see `episodic.storage.media`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from episodic.core.errors import (
    MediaMissing,
    MediaStoreError,
    MediaStoreMisconfigured,
    MediaStoreUnavailable,
)

# Error codes of S3 and its look-alikes that no retry cures.
_CONFIG_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "NoSuchBucket",
        "InvalidBucketName",
        "AuthorizationHeaderMalformed",
        "403",
        "AccountProblem",
        "InvalidToken",
        "ExpiredToken",
        "PermanentRedirect",
        "301",
    }
)
_TRANSIENT_NAMES = {
    "FSTimeoutError": "timed out",
    "ReadTimeoutError": "timed out",
    "ConnectTimeoutError": "timed out connecting",
    "EndpointConnectionError": "cannot connect",
    "ConnectionClosedError": "the connection was closed",
}
_CONFIG_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR})

# The key of the checksum question (`_ask_checksums`), under the store's prefix.
CHECKSUM_PROBE = ".probe/checksum"


class Backend:
    """One kind of store. Errors escape as the library raises them; `classify` maps them."""

    url: str

    def check_root(self) -> None:
        return None

    def write_new(self, key: str, content: bytes, media_type: str) -> bool:
        """Write `content` under `key` unless an object exists; True if this call wrote."""
        raise NotImplementedError

    def write_proven(
        self, key: str, content: bytes, media_type: str, sha256: str
    ) -> tuple[bool, bool]:
        """`write_new`, and whether the store itself proved that it holds exactly the bytes
        hashing to `sha256` under `key` (then no read-back is needed): (wrote, proven). A
        store that proves nothing answers False and its caller reads the object back."""
        return self.write_new(key, content, media_type), False

    def replace(self, key: str, content: bytes, media_type: str) -> None:
        raise NotImplementedError

    def read(self, key: str) -> bytes:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def occupied(self, key: str) -> bool:
        """Something that is not an object is where `key`'s object would be (a folder on a
        local store); an object store holds objects only."""
        return False

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def classify(self, exc: BaseException, key: str, action: str) -> MediaStoreError:
        raise NotImplementedError


class LocalBackend(Backend):
    """A folder on this machine (or a mount): temporary file, fsync, link, fsync."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url

    def check_root(self) -> None:
        if not self.root.is_dir():
            raise MediaStoreMisconfigured(
                f"media store {self.url}: no such folder"
                + (" (it exists and is not a folder)" if self.root.exists() else ""),
                url=self.url,
            )

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def write_new(self, key: str, content: bytes, media_type: str) -> bool:
        path = self._path(key)
        self.check_root()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_name(path)
        try:
            write_synced(tmp, content)
            try:
                os.link(tmp, path)  # fails if the key exists: never overwrites
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
                    raise
                if path.exists():  # no hard links here: the same bytes, renamed
                    return False
                os.replace(tmp, path)
            _sync_dir(path.parent)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def replace(self, key: str, content: bytes, media_type: str) -> None:
        path = self._path(key)
        tmp = temporary_name(path)
        try:
            write_synced(tmp, content)
            os.replace(tmp, path)
            _sync_dir(path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise MediaMissing(key, url=self.url) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def occupied(self, key: str) -> bool:
        path = self._path(key)
        return (path.exists() or path.is_symlink()) and not path.is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def classify(self, exc: BaseException, key: str, action: str) -> MediaStoreError:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        doing = f" ({action} {key})" if action else f" ({key})"
        if isinstance(exc, OSError) and exc.errno in _CONFIG_ERRNOS:
            return MediaStoreMisconfigured(
                f"media store {self.url} cannot be written: {reason}{doing}", url=self.url
            )
        if isinstance(exc, OSError) and exc.errno == errno.ENOENT and not self.root.is_dir():
            return MediaStoreMisconfigured(f"media store {self.url}: no such folder", url=self.url)
        return MediaStoreUnavailable(f"media store {self.url}: {reason}{doing}", url=self.url)


class RemoteBackend(Backend):
    """An object store through fsspec. The filesystem is made per process (an s3fs client
    belongs to the event loop of the process that made it) and without fsspec's instance
    cache, so settings and credentials are read when the store is opened.

    On S3 a write proves itself (`write_proven`): PutObject carries the content's SHA-256
    (``x-amz-checksum-sha256``); S3 computes the checksum of the body it received, refuses
    the request (400 ``BadDigest``) when they differ, and stores the checksum with the
    object, returned by PutObject and by HeadObject with ``ChecksumMode=ENABLED``
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity-upload.html).
    That proof holds only where the store checks the value: some S3 look-alikes store or
    echo a checksum header they never compared with the body. So once per process the
    store is asked to take a body with a wrong checksum (`_checks_checksums`): only a store
    that refuses it with ``BadDigest`` is trusted; any other is read back after each write,
    as are objects whose stored checksum is not that full-object SHA-256.
    """

    def __init__(self, scheme: str, root: str, url: str, timeout_s: float, attempts: int) -> None:
        self.scheme = scheme
        self.root = root
        self.url = url
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        # One call's whole deadline (fsspec cancels the call at it): the client's own
        # timeouts bound each read, but not a request whose body a stalled server never
        # takes.
        self._deadline = {"timeout": timeout_s * (self.attempts + 1)}
        self._lock = threading.Lock()
        self._fs: tuple[int, Any] | None = None
        self._checks_lock = threading.Lock()
        self._checks: tuple[int, bool] | None = None  # (pid, `_checks_checksums`)

    def fs(self) -> Any:
        with self._lock:
            if self._fs is None or self._fs[0] != os.getpid():
                import fsspec  # type: ignore[import-untyped]

                options: dict[str, Any] = {"skip_instance_cache": True}
                if self._is_s3:
                    options["use_listings_cache"] = False
                    # Standard mode: a refused checksum (BadDigest) is not retried.
                    options["config_kwargs"] = {
                        "connect_timeout": self.timeout_s,
                        "read_timeout": self.timeout_s,
                        "retries": {"total_max_attempts": self.attempts, "mode": "standard"},
                    }
                fs = fsspec.filesystem(self.scheme, **options)
                if self._is_s3:
                    fs.retries = 1  # botocore retries (attempts); s3fs's loop would multiply
                self._fs = (os.getpid(), fs)
            return self._fs[1]

    @property
    def _is_s3(self) -> bool:
        return self.scheme in ("s3", "s3a")

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def write_new(self, key: str, content: bytes, media_type: str) -> bool:
        extra = {"ContentType": media_type} if self._is_s3 else {}
        return self._create(key, content, extra)[0]

    def _create(self, key: str, content: bytes, extra: dict[str, str]) -> tuple[bool, Any]:
        """Put-if-absent: (True, the store's reply) if this call wrote, (False, None) if an
        object was there."""
        for attempt in range(self.attempts):
            try:
                reply = self.fs().pipe_file(
                    self._path(key), content, mode="create", **extra, **self._deadline
                )
            except FileExistsError:
                return False, None
            except OSError as exc:
                # S3 answers 409 to a conditional write racing another one of the same key.
                if error_code(exc) != "ConditionalRequestConflict" or attempt + 1 == self.attempts:
                    raise
                continue
            return True, reply
        raise AssertionError("unreachable")

    def write_proven(
        self, key: str, content: bytes, media_type: str, sha256: str
    ) -> tuple[bool, bool]:
        if not self._is_s3 or not self._checks_checksums():
            return self.write_new(key, content, media_type), False
        checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
        extra = {"ContentType": media_type, "ChecksumAlgorithm": "SHA256"}
        created, reply = self._create(key, content, extra | {"ChecksumSHA256": checksum})
        if created:  # S3 refuses a body that does not match; the reply names what it kept
            return True, isinstance(reply, dict) and reply.get("ChecksumSHA256") == checksum
        return False, self._holds(key, checksum, len(content))

    def _holds(self, key: str, checksum: str, size: int) -> bool:
        """Whether the object under `key` carries the full-object SHA-256 `checksum` that S3
        checked when it was written (and has `size` bytes). An object written without one
        (another tool, S3's default CRC) or in parts (a checksum of the parts' checksums,
        ``…-N``) is not proven here: the caller reads it back."""
        bucket, path, _ = self.fs().split_path(self._path(key))
        try:
            head = self.fs().call_s3(
                "head_object", Bucket=bucket, Key=path, ChecksumMode="ENABLED", **self._deadline
            )
        except FileNotFoundError as exc:
            if error_code(exc) in _CONFIG_CODES:
                raise
            return False
        return bool(head.get("ChecksumSHA256") == checksum and head.get("ContentLength") == size)

    def _checks_checksums(self) -> bool:
        """Whether this store refuses a body whose SHA-256 checksum header is wrong, asked
        once per process with a probe object it must refuse (one request). A store that
        takes it (the probe is then deleted) or refuses the header itself is read back after
        every write. The probe has one key (`CHECKSUM_PROBE`), written over each time: a
        store that takes it and forbids deletes keeps one probe object, not one per process."""
        with self._checks_lock:
            if self._checks is None or self._checks[0] != os.getpid():
                self._checks = (os.getpid(), self._ask_checksums())
            return self._checks[1]

    def _ask_checksums(self) -> bool:
        fs = self.fs()
        key = CHECKSUM_PROBE
        body = f"episodic checksum probe {uuid.uuid4().hex}".encode()
        wrong = base64.b64encode(hashlib.sha256(body + b"!").digest()).decode()
        extra = {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": wrong}
        try:
            fs.pipe_file(self._path(key), body, **extra, **self._deadline)
        except OSError as exc:
            code = error_code(exc)
            if code == "BadDigest":
                return True
            status = _status(exc)
            if code is None or code in _CONFIG_CODES or status is None:
                raise
            if status >= 500 and code != "NotImplemented":
                raise  # an outage: no answer about checksums
            return False  # a store that does not take the header at all
        with contextlib.suppress(Exception):
            fs.rm_file(self._path(key), **self._deadline)
        return False

    def replace(self, key: str, content: bytes, media_type: str) -> None:
        extra = {"ContentType": media_type} if self._is_s3 else {}
        self.fs().pipe_file(self._path(key), content, **extra, **self._deadline)

    def read(self, key: str) -> bytes:
        try:
            # One GET: s3fs would first ask the size (a HEAD) to read large objects in
            # concurrent ranges; media objects are small.
            extra = {"max_concurrency": 1} if self._is_s3 else {}
            return bytes(self.fs().cat_file(self._path(key), **extra, **self._deadline))
        except FileNotFoundError as exc:
            if error_code(exc) in _CONFIG_CODES:
                raise
            raise MediaMissing(key, url=self.url) from None

    def exists(self, key: str) -> bool:
        try:
            return bool(self.fs().info(self._path(key), **self._deadline).get("type") == "file")
        except FileNotFoundError as exc:
            if error_code(exc) in _CONFIG_CODES:
                raise
            return False

    def delete(self, key: str) -> None:
        self.fs().rm_file(self._path(key), **self._deadline)

    def classify(self, exc: BaseException, key: str, action: str) -> MediaStoreError:
        code = error_code(exc)
        name = type(exc).__name__
        if name == "NoCredentialsError" or name == "PartialCredentialsError":
            return MediaStoreMisconfigured(
                f"media store {self.url}: no credentials found (set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or a profile)",
                url=self.url,
            )
        if code in _CONFIG_CODES or isinstance(exc, PermissionError):
            what = {
                "NoSuchBucket": "no such bucket",
                "InvalidBucketName": "invalid bucket name",
                "InvalidAccessKeyId": "the access key is not known (wrong credentials)",
                "SignatureDoesNotMatch": "the secret key does not match (wrong credentials)",
            }.get(code or "", f"access denied ({code or name})")
            return MediaStoreMisconfigured(
                f"media store {self.url} cannot be used: {what}", url=self.url
            )
        doing = f" ({action} {key})" if action else f" ({key})"
        reason = code or _TRANSIENT_NAMES.get(name, name)
        return MediaStoreUnavailable(
            f"media store {self.url} is unavailable: {reason}{doing}", url=self.url
        )


def _reply(exc: BaseException) -> dict[str, Any] | None:
    """The S3 reply behind `exc` (s3fs keeps botocore's ClientError as the cause), if any."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return response
        seen = seen.__cause__
    return None


def error_code(exc: BaseException) -> str | None:
    """The S3 error code behind `exc`."""
    code = (_reply(exc) or {}).get("Error", {}).get("Code")
    return str(code) if code else None


def _status(exc: BaseException) -> int | None:
    """The HTTP status of the S3 reply behind `exc`, if there was a reply."""
    status = (_reply(exc) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def temporary_name(path: Path) -> Path:
    """A temporary file's name next to `path` (same directory: the rename or link stays on
    one filesystem), unique to this call, hidden (``.`` first: keys never start so)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_synced(path: Path, content: bytes) -> None:
    """Write `content` to the new file `path` and fsync it; on failure remove it."""
    handle = open(path, "xb")  # noqa: SIM115 (removed below on any failure)
    try:
        with handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise


def _sync_dir(folder: Path) -> None:
    """fsync a directory so a rename or link in it survives a power cut (POSIX)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
