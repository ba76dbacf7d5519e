"""The words of the media store: media types, content-addressed keys, proven and stored media.

A key is a store-relative POSIX string (``sha256/ab/cdef….png``), never a machine path: the
same key names the same bytes in a local folder, in a bucket, and on every machine that
opens the store. The key is derived from the bytes (their sha256) and the media type proven
from them, so two writers of one key write the same bytes by construction.

No I/O here: `pipeline.media.prove_image` decodes, `storage.media.MediaStore` reads and writes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

from episodic.core.errors import InvalidInput
from episodic.core.home import has_control_character

# The image types a paid image may be: what the providers we speak to answer with
# (Replicate's default is WEBP, fal's JPEG). Value: the key's extension.
IMAGE_TYPES: dict[str, str] = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp"}
# Documents the store also keeps (an episode's manifest); never proven as images.
DOCUMENT_TYPES: dict[str, str] = {"application/json": "json"}
MEDIA_EXTENSIONS: dict[str, str] = {**IMAGE_TYPES, **DOCUMENT_TYPES}

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")
MAX_KEY_CHARS = 512


def extension_for(media_type: str) -> str:
    """The key extension of `media_type` (``png``, ``jpg``, ``webp``, ``json``).
    Raises InvalidInput for any other type."""
    try:
        return MEDIA_EXTENSIONS[media_type]
    except KeyError:
        raise InvalidInput(
            f"media type {media_type!r} is not stored (known: {', '.join(MEDIA_EXTENSIONS)})"
        ) from None


def content_key(sha256: str, media_type: str) -> str:
    """The content-addressed key of bytes with this `sha256` (64 lowercase hex digits) and
    `media_type`: ``sha256/{first 2 digits}/{other 62}.{extension}``. The two-digit fan-out
    keeps a local folder's directories small."""
    if not _SHA256_RE.fullmatch(sha256):
        raise InvalidInput("a content key needs a sha256 of 64 lowercase hex digits")
    return f"sha256/{sha256[:2]}/{sha256[2:]}.{extension_for(media_type)}"


def validate_key(key: str) -> str:
    """`key` if it is a store-relative POSIX key: segments of ``A-Za-z0-9_.-`` separated by
    ``/``, none empty, none starting with a dot (``.``, ``..`` and the store's own temporary
    and probe objects are out of reach), at most 512 characters. Raises InvalidInput
    otherwise (absolute paths, backslashes, ``..``), without echoing more than the key."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise InvalidInput("a media key is 1 to 512 characters")
    if not all(_SEGMENT_RE.fullmatch(segment) for segment in key.split("/")):
        raise InvalidInput(
            f"invalid media key {key[:80]!r}: a store-relative POSIX key "
            "(segments of A-Za-z0-9 _ . -, none empty or starting with a dot)"
        )
    return key


@dataclass(frozen=True)
class ProvenImage:
    """Bytes that decoded in full as one of `IMAGE_TYPES` (`episodic.pipeline.media.prove_image`).

    ``content`` is the proven bytes themselves (not shown in ``repr``), so what is stored is
    what was proven; ``sha256`` (hex) and ``size`` (bytes) are theirs; ``width`` and
    ``height`` in pixels.
    """

    content: bytes = field(repr=False)
    media_type: str
    width: int
    height: int
    sha256: str
    size: int


@dataclass(frozen=True)
class StoredMedia:
    """What the store holds under ``key``, verified after writing: ``sha256`` (hex) and
    ``size`` (bytes) of the bytes re-read from the store, ``media_type``; ``width`` and
    ``height`` in pixels for images, None for documents. This is what the database records
    (never a machine path)."""

    key: str
    sha256: str
    size: int
    media_type: str
    width: int | None = None
    height: int | None = None


ProblemKind = Literal["missing", "size", "sha256"]


@dataclass(frozen=True)
class MediaProblem:
    """Why an object is not what was recorded: ``missing`` (no object under the key),
    ``size`` (another number of bytes), ``sha256`` (same size, other bytes)."""

    key: str
    kind: ProblemKind
    detail: str

    def __str__(self) -> str:
        return f"{self.key}: {self.detail}"


def content_problem(key: str, content: bytes, sha256: str, size: int) -> MediaProblem | None:
    """None when `content`, read under `key`, is `size` bytes hashing to `sha256` (hex): what
    was recorded as paid for; otherwise the ``size`` or ``sha256`` problem."""
    if len(content) != size:
        return MediaProblem(key, "size", f"holds {len(content)} bytes, {size} were recorded")
    if hashlib.sha256(content).hexdigest() != sha256:
        return MediaProblem(key, "sha256", "its bytes differ from the recorded sha256")
    return None


# Schemes whose user part can only be a credential (a bucket name has no ``@``); Azure's
# ``abfs://container@account…`` names a container there, so only a password is refused.
_NO_USER_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "file"})


def refuse_credentials(url: str) -> None:
    """Raise InvalidInput when the media store URL `url` carries a credential (a user or a
    password part, or a query string, where SAS tokens and keys would go): credentials come
    from the environment the SDKs read (``AWS_ACCESS_KEY_ID``, ...), never from a URL that
    is shown in messages and may be logged. The message never repeats the URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""
    if not scheme:
        return
    if parts.password is not None or (scheme in _NO_USER_SCHEMES and parts.username):
        raise InvalidInput(
            "the media store URL must not contain credentials: the AWS variables "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or the SDK's own configuration "
            "provide them"
        )
    if parts.query or parts.fragment:
        raise InvalidInput(
            "the media store URL takes no query or fragment (options and credentials come "
            "from the environment)"
        )


# Bucket names as S3 and GCS define them (lowercase: ``s3://BRK`` is never another bucket).
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs"})
_LOCAL_HOSTS = frozenset({"", "localhost"})


@dataclass(frozen=True)
class StoreUrl:
    """A media store URL taken apart: a local folder (``scheme`` empty: a plain path or a
    ``file:`` URL; ``path`` as written, maybe relative), or an object store (``scheme``,
    ``netloc``: the bucket or ``container@account``, ``prefix``: its segments joined by
    ``/``, maybe empty)."""

    scheme: str
    path: str = ""
    netloc: str = ""
    prefix: str = ""


def parse_store_url(url: str) -> StoreUrl:
    """`url` taken apart, or InvalidInput (one line, the URL never echoed with a control
    character) when it names no store unambiguously: blank, a control character, a
    credential (`refuse_credentials`), ``file://`` naming a host or no folder, a bucket
    name with capitals or other characters S3 and GCS refuse, or ``.``, ``..`` or empty
    segments in an object store's prefix (a literal key prefix there, a parent folder
    elsewhere: never both). Whether the scheme is supported is `episodic.storage.media`'s answer."""
    if has_control_character(url) or has_control_character(unquote(url)):
        raise InvalidInput("the media store URL contains a control character")
    if not url.strip():
        raise InvalidInput("the media store URL is blank (unset it for the default)")
    refuse_credentials(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""
    if not scheme:  # a plain path (or a Windows drive)
        return StoreUrl("", path=url)
    if scheme == "file":
        if parts.netloc not in _LOCAL_HOSTS:
            raise InvalidInput(
                f"media store {url}: a file:// URL names a folder of this machine, not the "
                f"host {parts.netloc!r} (use file:///absolute/folder or a plain path)"
            )
        if not parts.path:
            raise InvalidInput(f"media store {url}: the URL names no folder")
        return StoreUrl("", path=unquote(parts.path))
    netloc = parts.netloc
    shown = f"{scheme}://{netloc}"
    if scheme in _BUCKET_SCHEMES and netloc and not _BUCKET_RE.fullmatch(netloc):
        raise InvalidInput(
            f"media store {shown}: invalid bucket name {netloc!r} (3-63 lowercase letters, "
            "digits, '.', '-' or '_')"
        )
    container = netloc.split("@", 1)[0]
    if container != container.lower():
        raise InvalidInput(f"media store {shown}: container names are lowercase")
    prefix = parts.path.strip("/")
    for segment in prefix.split("/") if prefix else ():
        if segment in ("", ".", "..") or unquote(segment) in (".", ".."):
            raise InvalidInput(
                f"media store {shown}{parts.path}: the prefix has an empty, '.' or '..' "
                f"segment ({segment!r}): name the prefix as the keys are"
            )
    return StoreUrl(scheme, netloc=netloc, prefix=prefix)
