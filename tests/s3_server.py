"""A real S3-compatible server on loopback for the media store's tests: moto in server mode.

``S3Server`` runs ``python -m moto.server`` as its own process on a free 127.0.0.1 port (a
process, so a test can freeze it with SIGSTOP as a stalled store would be), waits until it
answers, and stops it at the end. Nothing leaves the machine. ``env()`` is what a client
needs: the endpoint and credentials in the AWS variables botocore reads itself, with every
other source of AWS configuration (profiles, shared files, instance metadata) shut off.

``enforce_auth`` (moto's IAM mode): every request must be signed by an access key made with
`make_access_key`; without it moto accepts any credential.

``checksums`` says what the server does with a PutObject's ``x-amz-checksum-*`` header:
``"validated"`` (the default) as Amazon S3 documents it: the server computes the body's
checksum, refuses a mismatch with 400 ``BadDigest`` and otherwise stores the checksum with
the object and returns it (PutObject's reply; HeadObject with ``ChecksumMode=ENABLED``)
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity-upload.html);
``"unverified"``: moto as it ships, which stores and returns the header's value without
checking it against the body; ``"none"``: a look-alike without checksums, which accepts the
header and neither keeps nor returns it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.fast_loop import no_servers_in_the_fast_loop

TEST_KEY = "testing-key-id"
TEST_SECRET = "testing-secret-not-a-secret"
REGION = "us-east-1"
_READY_WAIT_S = 60.0  # a loaded 2-core machine imports moto slowly


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Run in the server's process before moto's own main: the `checksums` modes (see above).
_LAUNCH = """
import sys
from moto.s3.exceptions import S3ClientError
from moto.s3.responses import S3Response
from moto.s3.utils import compute_checksum
from moto.server import main

mode = sys.argv[1]
shipped = S3Response._get_checksum

def _get_checksum(self, response_headers):
    if mode == "none":
        return "", None
    algorithm, value = shipped(self, response_headers)
    sent = algorithm and self.headers.get(f"x-amz-checksum-{algorithm.lower()}")
    if sent and mode == "validated":  # a header's value (a chunked body's trailer: unchecked)
        computed = compute_checksum(self.raw_body, algorithm=algorithm).decode()
        if computed != value:
            raise S3ClientError(
                "BadDigest", f"The {algorithm} you specified did not match the calculated checksum."
            )
    return algorithm, value

S3Response._get_checksum = _get_checksum
main(sys.argv[2:])
"""
CHECKSUM_MODES = ("validated", "unverified", "none")


class S3Server:
    def __init__(self, folder: Path, checksums: str = "validated") -> None:
        if checksums not in CHECKSUM_MODES:
            raise ValueError(f"checksums: one of {CHECKSUM_MODES}")
        self.checksums = checksums
        self.folder = folder
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = folder / f"moto-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def start(self) -> S3Server:
        no_servers_in_the_fast_loop("the S3 server")
        self.folder.mkdir(parents=True, exist_ok=True)
        address = ["-H", "127.0.0.1", "-p", str(self.port)]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, self.checksums, *address],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env()},
            )
        deadline = time.monotonic() + _READY_WAIT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited: {self.log.read_text()[-1500:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not answer") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.frozen:
            self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def freeze(self) -> None:
        """SIGSTOP: the server still accepts connections (the kernel does) but never answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.frozen = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.frozen = False

    def env(self, key: str = TEST_KEY, secret: str = TEST_SECRET) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",  # never ask 169.254.169.254
            "AWS_CONFIG_FILE": str(self.folder / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.folder / "no-aws-credentials"),
        }

    def client(self, service: str = "s3", **env: str) -> Any:
        import boto3

        values = {**self.env(), **env}
        return boto3.session.Session(
            aws_access_key_id=values["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=values["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client(service, endpoint_url=self.endpoint)

    def new_bucket(self) -> str:
        name = f"media-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def put_behind_the_store(self, bucket: str, key: str, body: bytes) -> None:
        """Write an object directly (another client, not the store): tampering."""
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def requests(self, bucket: str) -> list[tuple[str, str, int]]:
        """The requests this server has answered about `bucket`'s objects, as its own log
        records them: (method, key, status), oldest first."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = re.search(r'"([A-Z]+) /([^/ ?]+)/([^ ?]*)\S* HTTP/[0-9.]+" (\d{3})', line)
            if match and match.group(2) == bucket:
                found.append((match.group(1), match.group(3), int(match.group(4))))
        return found

    def enforce_auth(self) -> None:
        """From now on moto checks every request's signature and IAM policy."""
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},  # a form body would hide the count
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            json.loads(reply.read())

    def make_access_key(self, bucket: str, deny: tuple[str, ...] = ()) -> tuple[str, str]:
        """An IAM user allowed every S3 action but those in `deny` (such as
        ``s3:DeleteObject``: a bucket whose objects its writers may not delete); returns its
        (key id, secret)."""
        iam = self.client("iam")
        user = f"u{uuid.uuid4().hex[:10]}"
        iam.create_user(UserName=user)
        statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]
        if deny:
            statements.append({"Effect": "Deny", "Action": list(deny), "Resource": "*"})
        policy = {"Version": "2012-10-17", "Statement": statements}
        iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
        made = iam.create_access_key(UserName=user)["AccessKey"]
        return str(made["AccessKeyId"]), str(made["SecretAccessKey"])


@contextlib.contextmanager
def running_s3_server(folder: Path, checksums: str = "validated") -> Any:
    server = S3Server(folder, checksums).start()
    try:
        yield server
    finally:
        server.stop()
