"""The media store on its two backends, each test on both: a local folder and a real
S3-compatible server (moto in server mode, its own process on loopback).

Faults are real: objects rewritten behind the store's back by another client, a missing
folder or bucket, a read-only folder (a read-only mount as root) or wrong credentials (moto
checking signatures), a full disk (a 64 KiB tmpfs as root), a frozen S3 server (SIGSTOP).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
from PIL import Image

from episodic.core.errors import (
    InvalidInput,
    MediaCorrupt,
    MediaMissing,
    MediaStoreMisconfigured,
    MediaStoreUnavailable,
    NotAnImage,
)
from episodic.core.media import content_key
from episodic.core.output_files import RecordPaths
from episodic.pipeline.media import keep_image, prove_image
from episodic.storage.media import MediaStore
from tests.fs_faults import can_mount, read_only_folder, tiny_filesystem
from tests.integration import media_workers
from tests.s3_server import CHECKSUM_MODES, TEST_SECRET, S3Server, running_s3_server

KINDS = ["local", "s3"]


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (48, 32)) -> bytes:
    """A real image of random pixels: different every call, and barely compressible."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)).save(buffer, format=fmt)
    return buffer.getvalue()


@dataclass
class Target:
    """One store under test, and a way around it to its objects (as another client)."""

    kind: str
    url: str
    env: dict[str, str]
    server: S3Server | None = None
    bucket: str = ""
    root: Path | None = None

    def open(self, **options: Any) -> MediaStore:
        return MediaStore.open(self.url, **{"timeout_s": 5.0, "attempts": 2, **options})

    def write_behind(self, key: str, body: bytes) -> None:
        if self.root is not None:
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        else:
            assert self.server is not None
            self.server.put_behind_the_store(self.bucket, f"prefix/{key}", body)

    def delete_behind(self, key: str) -> None:
        if self.root is not None:
            (self.root / key).unlink()
        else:
            assert self.server is not None
            self.server.client().delete_object(Bucket=self.bucket, Key=f"prefix/{key}")

    def all_objects(self) -> list[str]:
        """Every file or object in the store, temporary and probe ones included."""
        if self.root is not None:
            return sorted(
                str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()
            )
        assert self.server is not None
        listed = self.server.client().list_objects_v2(Bucket=self.bucket)
        return sorted(str(o["Key"]).removeprefix("prefix/") for o in listed.get("Contents", []))


@pytest.fixture(params=KINDS)
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Target]:
    if request.param == "local":
        root = tmp_path / "media"
        root.mkdir()
        yield Target("local", str(root), {}, root=root)
        return
    server: S3Server = request.getfixturevalue("s3_server")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    bucket = server.new_bucket()
    yield Target("s3", f"s3://{bucket}/prefix", server.env(), server=server, bucket=bucket)


def test_put_stores_under_the_content_key_and_verifies(target: Target) -> None:
    store = target.open()
    content = image_bytes("WEBP")
    stored = store.put_image(prove_image(content))
    sha256 = hashlib.sha256(content).hexdigest()
    assert stored.key == content_key(sha256, "image/webp")
    assert stored.key == f"sha256/{sha256[:2]}/{sha256[2:]}.webp"
    assert (stored.sha256, stored.size, stored.media_type) == (sha256, len(content), "image/webp")
    assert (stored.width, stored.height) == (48, 32)
    assert store.read(stored.key) == content
    assert store.exists(stored.key)
    assert store.verify(stored.key, sha256, len(content)) is None
    assert store.put_image(prove_image(content)) == stored  # again: the same object
    assert target.all_objects() == [stored.key]  # no temporary file, no second copy


def test_a_document_is_stored_and_an_image_needs_its_proof(target: Target) -> None:
    store = target.open()
    manifest = json.dumps({"episode": "2026-W32-1"}).encode()
    stored = store.put_document(manifest)
    assert stored.key.endswith(".json") and stored.width is None
    assert store.read(stored.key) == manifest
    with pytest.raises(InvalidInput, match="put_image"):
        store.put_document(image_bytes(), media_type="image/png")


def test_other_bytes_under_a_key_are_never_overwritten(target: Target) -> None:
    store = target.open()
    content = image_bytes()
    image = prove_image(content)
    key = content_key(image.sha256, image.media_type)
    target.write_behind(key, b"tampered" + content[8:])
    with pytest.raises(MediaCorrupt, match=key):
        store.put_image(image)
    assert store.read(key) == b"tampered" + content[8:]  # left as found: evidence
    repaired = store.put_image(image, repair=True)
    assert store.read(key) == content
    assert store.verify(key, repaired.sha256, repaired.size) is None


def test_verify_names_what_changed(target: Target) -> None:
    store = target.open()
    content = image_bytes("JPEG")
    stored = store.put_image(prove_image(content))
    assert store.verify(stored.key, stored.sha256, stored.size) is None
    target.write_behind(stored.key, bytes(reversed(content)))  # same size, other bytes
    problem = store.verify(stored.key, stored.sha256, stored.size)
    assert problem is not None and problem.kind == "sha256"
    target.write_behind(stored.key, content + b"\0")
    problem = store.verify(stored.key, stored.sha256, stored.size)
    assert problem is not None and problem.kind == "size"
    assert "holds" in str(problem) and stored.key in str(problem)
    target.delete_behind(stored.key)
    problem = store.verify(stored.key, stored.sha256, stored.size)
    assert problem is not None and problem.kind == "missing"
    assert not store.exists(stored.key)
    with pytest.raises(MediaMissing):
        store.read(stored.key)


@pytest.fixture(params=CHECKSUM_MODES)
def checking(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[S3Server, str]]:
    """An S3 server of each kind (`tests.s3_server`: `checksums`) and a bucket on it."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with contextlib.ExitStack() as stack:
        if request.param == "validated":
            server: S3Server = request.getfixturevalue("s3_server")
        else:
            server = stack.enter_context(running_s3_server(tmp_path / "s3", request.param))
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server, server.new_bucket()


def _on_key(server: S3Server, bucket: str, key: str) -> list[tuple[str, int]]:
    return [(method, status) for method, k, status in server.requests(bucket) if k == key]


def test_s3_proves_a_write_by_its_checksum_and_other_stores_are_read_back(
    checking: tuple[S3Server, str],
) -> None:
    """A store that checks the SHA-256 a write carries answers for the bytes: the new
    object is never read back, an existing one is asked for its checksum (HEAD). A store
    that takes a wrong checksum (moto as it ships) or keeps none: every write re-read."""
    server, bucket = checking
    store = MediaStore.open(f"s3://{bucket}/prefix", timeout_s=5.0, attempts=2)
    content = image_bytes()
    stored = store.put_image(prove_image(content))
    again = store.put_image(prove_image(content))
    assert again == stored and store.read(stored.key) == content
    requests = _on_key(server, bucket, f"prefix/{stored.key}")
    if server.checksums == "validated":
        assert requests[:3] == [("PUT", 200), ("PUT", 412), ("HEAD", 200)]
        held = server.client().head_object(
            Bucket=bucket, Key=f"prefix/{stored.key}", ChecksumMode="ENABLED"
        )
        assert base64.b64decode(held["ChecksumSHA256"]).hex() == stored.sha256
    else:
        assert requests[:4] == [("PUT", 200), ("GET", 200), ("PUT", 412), ("GET", 200)]
    # The store asked once, with a body it must refuse: nothing of that question is left.
    probes = [r for r in server.requests(bucket) if r[1].startswith("prefix/.probe/")]
    assert len(probes) == (1 if server.checksums == "validated" else 2)
    assert target_objects(server, bucket) == [f"prefix/{stored.key}"]


@pytest.mark.parametrize("checking", ["unverified"], indirect=True)
def test_a_store_that_forbids_deletes_keeps_one_checksum_probe(
    checking: tuple[S3Server, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that takes the wrong checksum, whose writers may not delete (an IAM policy
    denying s3:DeleteObject): every process asks once, and all of them leave one probe
    object between them, not one each."""
    server, bucket = checking
    key_id, secret = server.make_access_key(bucket, deny=("s3:DeleteObject",))
    server.enforce_auth()
    for name, value in server.env(key_id, secret).items():
        monkeypatch.setenv(name, value)
    for _ in range(3):  # each store asks once, as each process does
        store = MediaStore.open(f"s3://{bucket}/prefix", timeout_s=5.0, attempts=1)
        store.put_image(prove_image(image_bytes()))
    deletes = [r for r in server.requests(bucket) if r[0] == "DELETE"]
    assert deletes and all(status == 403 for _, _, status in deletes)
    listed = server.client(**server.env(key_id, secret)).list_objects_v2(Bucket=bucket)
    probes = [o["Key"] for o in listed["Contents"] if ".probe/" in o["Key"]]
    assert probes == ["prefix/.probe/checksum"]


def test_an_object_s3_cannot_vouch_for_is_read_back(
    checking: tuple[S3Server, str],
) -> None:
    """Under a key: the same bytes another client wrote without a SHA-256 checksum (read
    back, kept); other bytes stored with a lying checksum, the content's own: refused where
    the store checks (400 BadDigest), otherwise never taken for proof: read back, where the
    SDK's own check of the reply against the stored checksum refuses it (moto as it ships)
    or the bytes differ (MediaCorrupt)."""
    server, bucket = checking
    store = MediaStore.open(f"s3://{bucket}/prefix", timeout_s=5.0, attempts=2)
    content = image_bytes()
    image = prove_image(content)
    key = content_key(image.sha256, image.media_type)
    server.put_behind_the_store(bucket, f"prefix/{key}", content)  # the SDK's default CRC32
    assert store.put_image(image).sha256 == image.sha256
    assert ("GET", 200) in _on_key(server, bucket, f"prefix/{key}")
    other = prove_image(image_bytes())
    other_key = content_key(other.sha256, other.media_type)
    lie = base64.b64encode(bytes.fromhex(other.sha256)).decode()
    tampered = b"tampered" + other.content[8:]
    put_lie = lambda: server.client().put_object(  # noqa: E731
        Bucket=bucket,
        Key=f"prefix/{other_key}",
        Body=tampered,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=lie,
    )
    if server.checksums == "validated":
        with pytest.raises(botocore.exceptions.ClientError, match="BadDigest"):
            put_lie()
        assert store.put_image(other).sha256 == other.sha256
    elif server.checksums == "unverified":
        put_lie()
        with pytest.raises(MediaStoreUnavailable, match="FlexibleChecksumError"):
            store.put_image(other)
        assert ("GET", 200) in _on_key(server, bucket, f"prefix/{other_key}")
    else:
        put_lie()
        with pytest.raises(MediaCorrupt, match=other_key):
            store.put_image(other)
        assert store.read(other_key) == tampered  # left as found


def target_objects(server: S3Server, bucket: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=bucket)
    return sorted(str(o["Key"]) for o in listed.get("Contents", []))


def test_keys_are_store_relative(target: Target) -> None:
    store = target.open()
    for bad in ("/etc/passwd", "../outside", "a//b", ".probe/x", "a\\b", "sha256/../x", ""):
        with pytest.raises(InvalidInput):
            store.read(bad)


def test_local_copy_checks_the_hash(target: Target, tmp_path: Path) -> None:
    store = target.open()
    content = image_bytes()
    stored = store.put_image(prove_image(content))
    out = tmp_path / "out"
    out.mkdir()
    copied = store.local_copy(
        stored.key, out / "cover.png", sha256=stored.sha256, keep=RecordPaths()
    )
    assert copied.read_bytes() == content
    with pytest.raises(MediaCorrupt):
        store.local_copy(stored.key, out / "other.png", sha256="0" * 64, keep=RecordPaths())
    assert sorted(p.name for p in out.iterdir()) == ["cover.png"]


def test_local_copy_never_replaces_a_symlink_or_a_fifo(target: Target, tmp_path: Path) -> None:
    """`assemble --out DIR` where DIR/cover.png is a symlink (or a FIFO): refused, one
    line, the link and what it points at left as they are (a rename would replace them)."""
    store = target.open()
    stored = store.put_image(prove_image(image_bytes()))
    elsewhere = tmp_path / "elsewhere.png"
    elsewhere.write_bytes(b"keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "cover.png").symlink_to(elsewhere)
    os.mkfifo(out / "pipe.png")
    for name in ("cover.png", "pipe.png"):
        with pytest.raises(InvalidInput, match=r"not a regular file|is a symlink"):
            store.local_copy(stored.key, out / name, sha256=stored.sha256, keep=RecordPaths())
    assert (out / "cover.png").is_symlink() and elsewhere.read_bytes() == b"keep"
    assert stat.S_ISFIFO((out / "pipe.png").lstat().st_mode)


def test_probe_writes_reads_and_cleans_up(target: Target) -> None:
    store = target.open()
    store.probe()
    assert target.all_objects() == []
    assert TEST_SECRET not in store.describe()
    assert store.describe() == (target.url if target.kind == "s3" else str(target.root))


def test_probe_refuses_a_missing_folder_or_bucket(target: Target, tmp_path: Path) -> None:
    if target.kind == "local":
        url = str(tmp_path / "not-mounted" / "media")
    else:
        url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/prefix"
    store = MediaStore.open(url, timeout_s=5, attempts=2)
    with pytest.raises(MediaStoreMisconfigured) as caught:
        store.probe()
    message = str(caught.value)
    assert "\n" not in message and store.describe() in message
    assert ("no such folder" if target.kind == "local" else "no such bucket") in message
    assert TEST_SECRET not in message and not caught.value.transient
    with pytest.raises(MediaStoreMisconfigured):
        store.put_image(prove_image(image_bytes()))


def test_probe_refuses_a_store_it_may_not_write(
    target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local: a read-only folder. S3: a server that checks signatures, and a wrong secret
    (after the right one worked, so the refusal is the credential's)."""
    if target.kind == "local":
        with read_only_folder(tmp_path / "read-only") as folder:
            store = MediaStore.open(str(folder))
            with pytest.raises(MediaStoreMisconfigured) as caught:
                store.probe()
            assert list(folder.iterdir()) == []
    else:
        with running_s3_server(tmp_path / "auth-s3") as server:
            bucket = server.new_bucket()
            key_id, secret = server.make_access_key(bucket)
            server.enforce_auth()
            for name, value in server.env(key_id, secret).items():
                monkeypatch.setenv(name, value)
            MediaStore.open(f"s3://{bucket}/p", timeout_s=5, attempts=1).probe()
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + secret)
            store = MediaStore.open(f"s3://{bucket}/p", timeout_s=5, attempts=1)
            with pytest.raises(MediaStoreMisconfigured) as caught:
                store.probe()
            assert secret not in str(caught.value) and key_id not in str(caught.value)
            assert "wrong credentials" in str(caught.value)
    assert "\n" not in str(caught.value) and store.describe() in str(caught.value)


def test_an_unavailable_store_is_a_transient_error(
    target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local: a full disk (nothing half-written left behind). S3: the server frozen."""
    content = image_bytes(size=(160, 160))  # over 77 KB: more than the 64 KiB disk
    image = prove_image(content)
    if target.kind == "local":
        if can_mount():
            with tiny_filesystem(tmp_path / "tiny", size_kib=64) as folder:
                store = MediaStore.open(str(folder))
                store.probe()  # a small write fits
                with pytest.raises(MediaStoreUnavailable) as caught:
                    store.put_image(image)
                assert [p for p in folder.rglob("*") if p.is_file()] == []
        else:
            caught_text = _full_disk_in_child(tmp_path / "limited", content)
            assert caught_text[0] == "MediaStoreUnavailable" and caught_text[2] is True
            return
    else:
        with running_s3_server(tmp_path / "frozen-s3") as server:
            for name, value in server.env().items():
                monkeypatch.setenv(name, value)
            bucket = server.new_bucket()
            # Only the frozen calls get the one-second budget: a loaded CI machine
            # may take longer than that to answer a put the server does serve.
            patient = MediaStore.open(f"s3://{bucket}/p")
            stored = patient.put_image(prove_image(image_bytes()))
            store = MediaStore.open(f"s3://{bucket}/p", timeout_s=1, attempts=1)
            server.freeze()
            try:
                with pytest.raises(MediaStoreUnavailable) as caught:
                    store.put_image(image)
                with pytest.raises(MediaStoreUnavailable):
                    store.verify(stored.key, stored.sha256, stored.size)
            finally:
                server.resume()
            assert patient.verify(stored.key, stored.sha256, stored.size) is None
            assert patient.put_image(image).size == len(content)  # and now it works
    assert caught.value.transient and "\n" not in str(caught.value)


def _full_disk_in_child(folder: Path, content: bytes) -> list[Any]:
    folder.mkdir()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(
        target=media_workers.full_disk_worker,
        args=(str(folder), content, len(content) // 2, results),
    )
    process.start()
    outcome: list[Any] = results.get(timeout=120)
    process.join(timeout=30)
    assert [p for p in folder.rglob("*") if p.is_file()] == []
    return outcome


def test_concurrent_puts_of_the_same_bytes_leave_one_intact_object(target: Target) -> None:
    content = image_bytes(size=(200, 120))
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=media_workers.put_worker,
            args=(barrier, target.url, target.env, content, results),
            daemon=True,
        )
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    answers = [results.get(timeout=180) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    sha256 = hashlib.sha256(content).hexdigest()
    assert answers == [["ok", content_key(sha256, "image/png"), sha256, len(content)]] * workers
    assert target.all_objects() == [content_key(sha256, "image/png")]
    assert target.open().read(content_key(sha256, "image/png")) == content


def test_urls_the_store_refuses(tmp_path: Path) -> None:
    with pytest.raises(MediaStoreMisconfigured, match=r"needs the package gcsfs"):
        MediaStore.open("gs://bucket/media")
    with pytest.raises(MediaStoreMisconfigured, match="unsupported scheme ftp://"):
        MediaStore.open("ftp://host/media")
    with pytest.raises(InvalidInput, match="must not contain credentials") as caught:
        MediaStore.open("s3://AKIAEXAMPLE:hunter2@bucket/media")
    assert "hunter2" not in str(caught.value) and "AKIAEXAMPLE" not in str(caught.value)
    local = MediaStore.open(f"file://{tmp_path}/m", create=True)
    assert local.describe() == str(tmp_path / "m") and (tmp_path / "m").is_dir()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("s3://BRK_bad/x", "bucket"),  # never silently lowercased into another bucket
        ("s3://Brk/x", "bucket"),
        ("s3://brk/../x", "'..'"),
        ("s3://brk/a/./x", "'.'"),
        ("s3://brk/a//x", "empty"),
        ("s3://br\x01k/x", "control character"),
        ("s3://brk/x\ny", "control character"),
        ("/tmp/m\x1b[31m", "control character"),
        ("file://relative/x", "host"),  # the host would be dropped: /x
        ("file://", "no folder"),
        (" ", "blank"),
    ],
)
def test_urls_that_name_no_store_are_refused(url: str, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason) as caught:
        MediaStore.open(url, create=False)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and not any(ord(c) < 32 for c in message)


def test_a_relative_store_is_the_projects_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "episodic"\n')
    monkeypatch.setenv("EPISODIC_PROJECT_DIR", str(project))
    monkeypatch.chdir(tmp_path)
    assert MediaStore.open("media").describe() == str(project / "media")
    assert MediaStore.open("file:store/m").describe() == str(project / "store" / "m")
    assert MediaStore.open("file://localhost/srv/m").describe() == "/srv/m"
    assert not (tmp_path / "media").exists() and not (project / "media").exists()


class _FailingS3(BaseHTTPRequestHandler):
    """An S3 endpoint whose every answer is one error (status and code set on the server)."""

    protocol_version = "HTTP/1.1"  # answers botocore's Expect: 100-continue on uploads

    def _answer(self) -> None:
        server: Any = self.server
        server.requests.append(self.command)
        self._drain()
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{server.code}</Code>"
            "<Message>injected</Message></Error>"
        ).encode()
        self.send_response(server.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _drain(self) -> None:
        """Read the request's body (botocore streams uploads chunked, with a checksum
        trailer) so the client hears the answer instead of waiting to finish sending."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                self.rfile.read(size + 2)
            while self.rfile.readline().strip():  # trailers, up to the blank line
                pass
        elif length := int(self.headers.get("Content-Length") or 0):
            self.rfile.read(length)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "code"), [(503, "ServiceUnavailable"), (500, "InternalError"), (503, "SlowDown")]
)
def test_server_errors_are_transient_and_tried_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: int, code: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingS3)
    server.requests, server.status, server.code = [], status, code  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        fake = S3Server(tmp_path)
        fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
        store = MediaStore.open("s3://bucket/p", timeout_s=5, attempts=2)
        with pytest.raises(MediaStoreUnavailable, match="is unavailable") as caught:
            store.read("sha256/00/x.png")
        assert caught.value.transient
        assert server.requests == ["GET", "GET"]  # type: ignore[attr-defined]  # attempts
        server.requests.clear()  # type: ignore[attr-defined]
        with pytest.raises(MediaStoreUnavailable, match="is unavailable"):
            store.probe()
        assert server.requests == ["PUT", "PUT"]  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def test_threads_of_one_process_share_a_store(target: Target) -> None:
    """The CLI stores a run's images from its worker threads through one store."""
    store = target.open()
    contents = [image_bytes("PNG", (24, 24)) for _ in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        stored = list(pool.map(lambda c: store.put_image(prove_image(c)), contents))
    assert sorted(s.key for s in stored) == target.all_objects()
    for content, item in zip(contents, stored, strict=True):
        assert store.read(item.key) == content


def test_a_kept_image_is_verified_and_what_is_not_an_image_is_never_kept(target: Target) -> None:
    """The pipeline's two steps over the store: prove then keep; the store verifies what it
    holds against what was recorded."""
    store = target.open()
    content = image_bytes("JPEG")
    stored = keep_image(store, prove_image(content))
    assert store.verify(stored.key, stored.sha256, stored.size) is None
    with pytest.raises(NotAnImage):
        keep_image(store, prove_image(b"<html>gateway timeout</html>"))
    assert target.all_objects() == [stored.key]  # nothing stored for the HTML page
    target.delete_behind(stored.key)
    problem = store.verify(stored.key, stored.sha256, stored.size)
    assert problem is not None and problem.kind == "missing"


def test_the_default_store_is_a_folder_in_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.settings import load_settings

    settings = load_settings()  # EPISODIC_HOME: tmp_path/home (tests/conftest.py)
    store = MediaStore.from_settings(settings)
    assert store.describe() == str(settings.home_path / "media")
    store.probe()
    assert (settings.home_path / "media").is_dir()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(tmp_path / "unmounted"))
    configured = MediaStore.from_settings(load_settings())
    with pytest.raises(MediaStoreMisconfigured, match="no such folder"):
        configured.probe()
    assert not (tmp_path / "unmounted").exists()  # a configured folder is never invented


def test_a_store_travels_by_its_url(target: Target) -> None:
    """Pickled for a process pool or a Dask worker: reopened there, same objects."""
    import pickle

    store = target.open()
    stored = store.put_image(prove_image(image_bytes()))
    again = pickle.loads(pickle.dumps(store))
    assert again.describe() == store.describe()
    assert again.verify(stored.key, stored.sha256, stored.size) is None
