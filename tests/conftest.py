"""Session fixtures: a real control plane, moto's server and the operator process.

Tests drive the operator the way a user does: kubectl and the Kubernetes API for
custom resources and Secrets, boto3 against moto's server for the cloud side.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
import yaml

from provisioner_dev.awsenv import aws_env
from provisioner_dev.controlplane import ControlPlane, write_token_kubeconfig
from provisioner_dev.kubectl import run_kubectl
from provisioner_dev.launch import Stack
from provisioner_dev.services import MotoServer, OperatorProcess

if TYPE_CHECKING:
    from provisioner_dev.localstack import LocalStackServer

# Short enough that drift, deleted Secrets and vanished resources are seen within a test.
TEST_RESYNC_SECONDS = 4
# The cloud behind the tests: moto's server (default) or LocalStack (`make test-localstack`).
TEST_CLOUD = os.environ.get("PROVISIONER_TEST_CLOUD", "moto")
# A cluster that already runs (kind, k3d, minikube, a dev EKS, ...): the suite uses it instead
# of starting a control plane, and skips the tests that need one of their own.
EXISTING_KUBECONFIG = os.environ.get("PROVISIONER_TEST_KUBECONFIG") or None
needs_own_controlplane = pytest.mark.skipif(
    EXISTING_KUBECONFIG is not None,
    reason="starts, restarts or inspects a control plane of its own "
    "(PROVISIONER_TEST_KUBECONFIG names an existing cluster)",
)
on_moto_only = pytest.mark.skipif(
    TEST_CLOUD != "moto", reason="counts requests with moto's recorder"
)


@dataclass
class Cluster:
    controlplane: ControlPlane
    moto: MotoServer | LocalStackServer
    dir: Path
    stack: Stack

    @property
    def kubeconfig(self) -> str:
        return str(self.stack.kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = run_kubectl(self.kubeconfig, *args, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    @property
    def has_controller_manager(self) -> bool:
        return self.stack.has_controller_manager

    def kubectl_as(
        self, token: str, *args: str, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl with only a bearer token: no client certificate to fall back on."""
        path = self.dir / f"token-{uuid.uuid4().hex[:8]}.kubeconfig"
        self.token_kubeconfig("token", token, path)
        try:
            return run_kubectl(path, *args, input=input, timeout=60)
        finally:
            path.unlink()

    def token_kubeconfig(
        self, user: str, token: str, path: Path, namespace: str | None = None
    ) -> Path:
        write_token_kubeconfig(path, self.stack.endpoint, user, token, namespace)
        return path

    def cloud_requests(self, needle: str) -> list[str]:
        """Every request moto received so far that mentions `needle` (a cloud name)."""
        path = self.moto.record_to
        if path is None or not path.exists():
            return []
        found = []
        for line in path.read_text(errors="replace").splitlines():
            entry = json.loads(line)
            body = entry.get("body") or ""
            if entry.get("body_encoded"):
                body = base64.b64decode(body).decode(errors="replace")
            text = f"{entry.get('url', '')} {body}"
            if needle in text:
                found.append(text)
        return found


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    """A control plane with the CRDs installed and a cloud (moto or LocalStack) of its own."""
    workdir = Path(tempfile.mkdtemp(prefix="provisioner-test-"))
    existing = Path(EXISTING_KUBECONFIG).resolve() if EXISTING_KUBECONFIG else None
    stack = Stack(dir=workdir, cloud_kind=TEST_CLOUD, record=True, existing=existing)
    try:
        stack.start()
        yield Cluster(controlplane=stack.controlplane, moto=stack.cloud, dir=workdir, stack=stack)
    finally:
        stack.stop()
        if os.environ.get("PROVISIONER_KEEP_TEST_DIR"):
            print(f"test data kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The suite's shared control plane and cloud.

    Nothing may restart its processes: the session operator's RBAC check (below) would see
    the 403s of a restarting API server. Tests that restart one use `own_stack`
    (tests/e2e/conftest.py), a stack of their own from `running_cluster()`.
    """
    with running_cluster() as shared:
        # Fail every time, not only when the session operator's timing is unlucky.
        shared.controlplane.restart_apiserver = _refuse_restart  # type: ignore[method-assign]
        yield shared


def _refuse_restart(*_: object, **__: object) -> None:
    raise AssertionError(
        "the shared control plane is never restarted: restart the one of `own_stack`"
    )


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Cluster:
    return cluster


SHIPPED_MANIFESTS = Path(__file__).resolve().parents[1] / "deploy/manifests/provisioner.yaml"
# The session's operator skips `own-*` namespaces with a glob, and a glob needs kopf's
# namespace observer: the one thing it is granted beyond the shipped ClusterRole.
GLOB_RULES = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
]


def shipped_cluster_role_rules() -> list[dict]:
    """The rules of every ClusterRole the shipped manifest binds to the operator."""
    docs = [d for d in yaml.safe_load_all(SHIPPED_MANIFESTS.read_text()) if d]
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    rules = [
        r
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] in bound
        for r in d["rules"]
    ]
    if not rules:
        raise AssertionError(f"no bound ClusterRole in {SHIPPED_MANIFESTS}")
    return rules


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[OperatorProcess]:
    """The operator under test, authenticated as a ServiceAccount with the shipped RBAC.

    It watches every namespace except `own-*`: tests that need an operator of their own
    (crashes, faults, peering, RBAC) run it in an `own-*` namespace, where this one never acts.
    """
    op = cluster.stack.start_operator(
        rbac_rules=shipped_cluster_role_rules() + GLOB_RULES,
        log=cluster.dir / "operator.log",
        args=[f"--resync-seconds={TEST_RESYNC_SECONDS}", "--namespace=!own-*"],
        cluster_id="test",
    )
    try:
        yield op
    finally:
        op.stop()
        _fail_on_secret_leak(cluster.dir / "operator.log")
        # An RBAC denial reads `... is forbidden: User "system:serviceaccount:..." cannot`;
        # a write into a namespace being deleted is a 403 too, but not a denial. Every denial
        # counts, however brief: the shared control plane is never restarted, and a restart is
        # the one time a correct grant is refused: a starting kube-apiserver accepts requests
        # before it is ready and refuses them until its RBAC informers have synced (Kubernetes
        # behaves so by design; see kubernetes/kubernetes#101422), and a client reconnecting
        # the moment the port opens gets a 403 that is no verdict on its ClusterRole.
        forbidden = [
            line
            for line in op.log.read_text(errors="replace").splitlines()
            if 'forbidden: User "' in line
        ]
        assert not forbidden, f"the shipped RBAC refused the operator: {forbidden[:3]}"


def _fail_on_secret_leak(log: Path) -> None:
    """No generated password may ever reach the operator's log."""
    # The passwords themselves are checked by the tests that know them; here, a cheap
    # guard against whole Secret payloads or URIs with credentials being logged.
    text = log.read_text(errors="replace") if log.exists() else ""
    assert "MasterUserPassword" not in text, "the operator logged a master password parameter"


def fresh_namespace(cluster: Cluster, prefix: str) -> Iterator[str]:
    """A namespace of the test's own, deleted (without waiting) when the test ends."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    yield from fresh_namespace(cluster, "t")


@pytest.fixture(scope="session")
def aws(cluster: Cluster) -> AwsClients:
    return aws_clients(cluster.moto.url)


def aws_clients(endpoint_url: str) -> AwsClients:
    env = aws_env(endpoint_url)
    session = boto3.session.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )
    return AwsClients(
        s3=session.client("s3", endpoint_url=endpoint_url),
        sqs=session.client("sqs", endpoint_url=endpoint_url),
        rds=session.client("rds", endpoint_url=endpoint_url),
        sns=session.client("sns", endpoint_url=endpoint_url),
    )


@dataclass
class AwsClients:
    s3: object
    sqs: object
    rds: object
    sns: object
