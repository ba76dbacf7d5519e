"""The media store's backends: a local folder, and object stores through fsspec.

`episodic.storage.media.MediaStore` is the one user; each backend lets its library's errors escape
and maps them once in `classify` (transient or configuration, see `episodic.storage.media`).
"""

from __future__ import annotations

import contextlib
import errno
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


class Backend:
    """One kind of store. Errors escape as the library raises them; `classify` maps them."""

    url: str

    def check_root(self) -> None:
        return None

    def write_new(self, key: str, content: bytes, media_type: str) -> bool:
        """Write `content` under `key` unless an object exists; True if this call wrote."""
        raise NotImplementedError

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
    cache, so settings and credentials are read when the store is opened."""

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

    def fs(self) -> Any:
        with self._lock:
            if self._fs is None or self._fs[0] != os.getpid():
                import fsspec  # type: ignore[import-untyped]

                options: dict[str, Any] = {"skip_instance_cache": True}
                if self.scheme in ("s3", "s3a"):
                    options["use_listings_cache"] = False
                    options["config_kwargs"] = {
                        "connect_timeout": self.timeout_s,
                        "read_timeout": self.timeout_s,
                        "retries": {"total_max_attempts": self.attempts, "mode": "standard"},
                    }
                fs = fsspec.filesystem(self.scheme, **options)
                if self.scheme in ("s3", "s3a"):
                    fs.retries = 1  # botocore retries (attempts); s3fs's loop would multiply
                self._fs = (os.getpid(), fs)
            return self._fs[1]

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def write_new(self, key: str, content: bytes, media_type: str) -> bool:
        extra = {"ContentType": media_type} if self.scheme in ("s3", "s3a") else {}
        for attempt in range(self.attempts):
            try:
                self.fs().pipe_file(
                    self._path(key), content, mode="create", **extra, **self._deadline
                )
            except FileExistsError:
                return False
            except OSError as exc:
                # S3 answers 409 to a conditional write racing another one of the same key.
                if error_code(exc) != "ConditionalRequestConflict" or attempt + 1 == self.attempts:
                    raise
                continue
            return True
        raise AssertionError("unreachable")

    def replace(self, key: str, content: bytes, media_type: str) -> None:
        extra = {"ContentType": media_type} if self.scheme in ("s3", "s3a") else {}
        self.fs().pipe_file(self._path(key), content, **extra, **self._deadline)

    def read(self, key: str) -> bytes:
        try:
            # One GET: s3fs would first ask the size (a HEAD) to read large objects in
            # concurrent ranges; media objects are small.
            extra = {"max_concurrency": 1} if self.scheme in ("s3", "s3a") else {}
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


def error_code(exc: BaseException) -> str | None:
    """The S3 error code behind `exc` (s3fs keeps botocore's ClientError as the cause)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code else None
        seen = seen.__cause__
    return None


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
