"""A moto server for the whole session, and a builder of custom resources."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from provisioner.aws.session import Aws, AwsSettings
from provisioner.kinds import registry as kinds
from provisioner.kinds.registry import make_aws
from provisioner.model.resource import Resource

START_DEADLINE_S = 30.0
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
UNSET = ("AWS_SESSION_TOKEN", "AWS_PROFILE")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, server: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            with open(log_path) as log:
                raise RuntimeError(f"moto server exited with {server.returncode}:\n{log.read()}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):  # noqa: S310 - loopback
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer at {url} within {START_DEADLINE_S}s")


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = str(tmp_path_factory.mktemp("moto") / "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_up(url, server, log_path)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="session")
def aws(moto_url: str) -> Iterator[Aws]:
    saved = {key: os.environ.get(key) for key in (*FAKE_CREDENTIALS, *UNSET)}
    os.environ.update(FAKE_CREDENTIALS)
    for key in UNSET:
        os.environ.pop(key, None)
    try:
        yield make_aws(AwsSettings(region="us-east-1", endpoint_url=moto_url))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_resource(
    kind: str,
    spec: dict[str, Any] | None = None,
    *,
    name: str = "app",
    namespace: str = "team-a",
    tags: dict[str, str] | None = None,
    deletion_policy: str | None = None,
    region: str = "us-east-1",
) -> Resource:
    """A parsed custom resource with a fresh uid, so tests never share cloud names."""
    raw_spec = {**(spec or {}), "tags": dict(tags or {})}
    if deletion_policy:
        raw_spec["deletionPolicy"] = deletion_policy
    body = {
        "kind": kind,
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": str(uuid.uuid4()),
            "generation": 1,
        },
        "spec": raw_spec,
    }
    return kinds.parse(body, region=region, cluster_id="test-cluster")


@pytest.fixture
def make_resource() -> Callable[..., Resource]:
    return build_resource


def full_client(client: Any) -> Any:
    """`client` (an operator's: its endpoint, region and credentials, those of an assumed role
    included) with botocore's whole model, for a test's own calls that the operator never
    makes and so its pruned model leaves out (provisioner/aws/botodata.py)."""
    frozen = client._request_signer._credentials.get_frozen_credentials()
    return boto3.session.Session().client(
        client.meta.service_model.service_name,
        region_name=client.meta.region_name,
        endpoint_url=client.meta.endpoint_url,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    )
