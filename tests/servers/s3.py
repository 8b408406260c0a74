"""A real S3-compatible server on 127.0.0.1 for the tests: moto's S3 service in a child process.

Why moto: it installs from PyPI (``moto[server]``), needs no Docker or JVM, starts in about a
second, and implements S3's conditional writes: ``PUT`` with ``If-None-Match: *`` (create only)
and ``If-Match: <etag>`` (compare-and-swap) answer ``412 Precondition Failed`` when the
condition does not hold. delta-rs commits and our own put-if-absent rely on exactly that.

S3 evaluates a condition and stores the object as one atomic step. moto checks the condition
and then stores the object in two separate steps of a threaded server, so two racing writers
could in principle both pass the check. The child process therefore serializes the requests
that change objects (``PUT``, ``POST``, ``DELETE``), which gives the tests S3's guarantee;
reads stay concurrent.

The child dies with its parent: it watches its standard input, which is a pipe from the
parent, and exits when that closes (even when the parent was SIGKILLed).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# Fake credentials: moto accepts any; they only need to look like AWS keys to the clients.
ACCESS_KEY = "AKIADSITESTS3SERVER0"
SECRET_KEY = "dsi-test-secret-key-not-a-real-one-0000000"
REGION = "us-east-1"
DEFAULT_BUCKET = "lake"

_MUTATING_METHODS = frozenset({"PUT", "POST", "DELETE"})


class S3Server:
    """One moto S3 server in a child process, with one bucket, reachable on 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        bucket: str = DEFAULT_BUCKET,
        start_timeout_s: float = 60.0,
        *,
        check_credentials: bool = False,
    ) -> None:
        """``check_credentials``: the server refuses requests not signed with the tests'
        key and secret (moto's IAM authentication: 403 ``InvalidAccessKeyId`` or
        ``SignatureDoesNotMatch``, as S3 answers), instead of accepting any."""
        self.bucket = bucket
        self.check_credentials = check_credentials
        self.host = "127.0.0.1"
        self.port = 0
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> S3Server:
        """Start the server on a free port, wait until it answers, create the bucket."""
        if self._process is not None:
            return self
        # The child binds port 0 itself and prints the port it got: no race for a free port.
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.servers.s3",
                "--host",
                self.host,
                *(["--check-credentials"] if self.check_credentials else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=_repo_root(),
        )
        try:
            self.port = self._read_port()
            self._wait_until_ready()
            self.client().create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the child process (closing its stdin makes it exit; kill if it does not)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(Exception):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _read_port(self) -> int:
        process = self._process
        assert process is not None
        stdout = process.stdout
        assert stdout is not None
        result: list[bytes] = []
        # readline() blocks; a thread lets a server that never prints time out.
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self._start_timeout_s)
        line = result[0].decode().strip() if result else ""
        if not line.startswith("PORT "):
            raise RuntimeError(
                f"the S3 test server did not start within {self._start_timeout_s}s "
                f"(exit code {process.poll()}, first line {line!r}); "
                "is moto[server] installed (make install)?"
            )
        return int(line.split()[1])

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.endpoint_url + "/", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer means the server is serving
            except OSError:
                if time.monotonic() > deadline or not self.running:
                    raise RuntimeError("the S3 test server did not answer") from None
                time.sleep(0.05)

    # -- how clients reach it -----------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, path: str = "", scheme: str = "s3") -> str:
        """``s3://<bucket>/<path>`` (or another scheme, e.g. ``s3a`` for Spark)."""
        return f"{scheme}://{self.bucket}/{path.lstrip('/')}".rstrip("/")

    def fresh_prefix(self, name: str = "lake") -> str:
        """A new, empty ``s3://`` folder, unique per call (tests share one server)."""
        return self.uri(f"{name}-{uuid.uuid4().hex[:12]}")

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs (``deltalake``) storage options for this server.

        Path-style addressing is object_store's default when an endpoint is set; no
        locking provider or conditional-put option is needed: delta-rs 1.x commits with
        ``If-None-Match: *`` by default.
        """
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    @property
    def spark_conf(self) -> dict[str, str]:
        """Spark configuration for ``s3a://`` against this server (hadoop-aws 3.4, SDK v2).

        The hadoop-aws jars themselves come from ``spark.jars.packages`` (see
        ``S3A_PACKAGES``). The endpoint carries its ``http://`` scheme, which is what
        makes s3a use plain HTTP; ``connection.ssl.enabled`` only matters for an endpoint
        without a scheme and is set for clarity. Path-style access because the bucket is
        not a DNS name on 127.0.0.1. The keys are in the Hadoop configuration, so they show
        in the Spark UI's environment page (``spark.ui.enabled`` is off in the tests).
        """
        prefix = "spark.hadoop.fs.s3a."
        return {
            prefix + "endpoint": self.endpoint_url,
            prefix + "endpoint.region": REGION,
            prefix + "path.style.access": "true",
            prefix + "connection.ssl.enabled": "false",
            prefix + "aws.credentials.provider": (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            ),
            prefix + "access.key": ACCESS_KEY,
            prefix + "secret.key": SECRET_KEY,
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server (tests use it to look at objects directly)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def set_secret(self, secret: str) -> None:
        """Give the tests' key another secret (a server started with ``check_credentials``):
        from now on it refuses requests signed with the old one, as S3 refuses a rotated
        or deactivated key."""
        assert self.check_credentials, "the server accepts any credentials"
        request = urllib.request.Request(
            self.endpoint_url + CONTROL_PATH, data=secret.encode(), method="PUT"
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read() == b"ok"

    def keys(self, prefix: str = "") -> list[str]:
        """Every key in the bucket below a prefix (a path or an ``s3://`` URI)."""
        if prefix.startswith(("s3://", "s3a://")):
            prefix = prefix.split("://", 1)[1].split("/", 1)[1] if "/" in prefix else ""
        paginator = self.client().get_paginator("list_objects_v2")
        found: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            found.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(found)


# hadoop-aws must match the hadoop-client jars bundled with pyspark (3.4.2 in pyspark 4.1);
# it pulls in the AWS SDK v2 bundle it was built with (2.29.52) through Ivy.
HADOOP_AWS_VERSION = "3.4.2"
S3A_PACKAGES = f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}"


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the child process ------------------------------------------------------------------


def _serialize_writes(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Run the requests that change objects one at a time (see the module docstring)."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in _MUTATING_METHODS:
            return app(environ, start_response)
        with lock:
            # Materialize the body inside the lock: the store happens while it is produced.
            return list(app(environ, start_response))

    return wrapped


def _exit_when_parent_goes(stream: Iterator[bytes]) -> None:
    for _ in stream:
        pass
    os._exit(0)


CONTROL_PATH = "/_dsi/secret"
"""A request path of the test server (not S3's): a PUT there sets the tests' key's secret."""


def _control(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Serve :data:`CONTROL_PATH` (rotate the key's secret: the server then refuses
    requests signed with the old one); pass everything else to moto."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != CONTROL_PATH:
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        secret = environ["wsgi.input"].read(length).decode()
        _tests_key().secret_access_key = secret
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return wrapped


def _tests_key() -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    [key] = iam_backends[DEFAULT_ACCOUNT_ID]["aws"].get_user("dsi-tests").access_keys
    return key


def _check_credentials() -> None:
    """Make moto authenticate every request (signature and key) against one IAM user
    holding the tests' key and secret, allowed everything."""
    import json

    from moto import settings
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(REGION, "dsi-tests")
    key = iam.create_access_key("dsi-tests")
    key.access_key_id, key.secret_access_key = ACCESS_KEY, SECRET_KEY
    allowed = {"Effect": "Allow", "Action": "*", "Resource": "*"}
    everything = {"Version": "2012-10-17", "Statement": [allowed]}
    iam.put_user_policy("dsi-tests", "everything", json.dumps(everything))
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0


def main(argv: list[str]) -> None:
    import argparse

    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--check-credentials", action="store_true")
    args = parser.parse_args(argv)
    if args.check_credentials:
        _check_credentials()

    app = _control(_serialize_writes(create_backend_app("s3")))
    server = make_server(
        args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler
    )
    threading.Thread(
        target=_exit_when_parent_goes, args=(iter(sys.stdin.buffer),), daemon=True
    ).start()
    sys.stdout.write(f"PORT {server.port}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
