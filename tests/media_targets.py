"""The media store a test's commands use, on both backends: a local folder and a bucket of
the session's S3-compatible server (moto, loopback). `media` is the fixture: it sets
EPISODIC_MEDIA_URL (and, for S3, the AWS variables botocore reads) for the test, and gives
a way around the store to its objects, as another client would tamper with them.

Import the fixture into a test module (``from tests.media_targets import media``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from episodic.storage.media import MediaStore
from tests.s3_server import S3Server

MEDIA_KINDS = ["local", "s3"]


@dataclass
class MediaTarget:
    kind: str
    url: str
    server: S3Server | None = None
    bucket: str = ""
    root: Path | None = None

    def store(self) -> MediaStore:
        return MediaStore.open(self.url)

    def _object(self, key: str) -> str:
        return f"prefix/{key}"

    def read_behind(self, key: str) -> bytes:
        if self.root is not None:
            return (self.root / key).read_bytes()
        assert self.server is not None
        reply = self.server.client().get_object(Bucket=self.bucket, Key=self._object(key))
        return bytes(reply["Body"].read())

    def write_behind(self, key: str, body: bytes) -> None:
        """Replace the object under `key` by `body`, not through the store."""
        if self.root is not None:
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            return
        assert self.server is not None
        self.server.put_behind_the_store(self.bucket, self._object(key), body)

    def delete_behind(self, key: str) -> None:
        if self.root is not None:
            (self.root / key).unlink()
            return
        assert self.server is not None
        self.server.client().delete_object(Bucket=self.bucket, Key=self._object(key))


def open_target(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MediaTarget:
    """A fresh store of `kind` (``local``: a new folder; ``s3``: a new bucket), named by
    EPISODIC_MEDIA_URL for the rest of the test."""
    if kind == "local":
        root = tmp_path / "media-store"
        root.mkdir()
        target = MediaTarget("local", str(root), root=root)
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        bucket = server.new_bucket()
        target = MediaTarget("s3", f"s3://{bucket}/prefix", server=server, bucket=bucket)
    monkeypatch.setenv("EPISODIC_MEDIA_URL", target.url)
    return target


@pytest.fixture(params=MEDIA_KINDS)
def media(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MediaTarget]:
    yield open_target(request.param, request, tmp_path, monkeypatch)
