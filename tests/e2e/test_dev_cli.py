"""`provisioner dev up|status|down`: idempotent, a dead operator restarted alone, a dead
control plane or moto started over, the developer's own `provisioner run`, nothing left running;
the cluster as the chart installs it (admission policies, roles, spec.access through IRSA).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from provisioner_dev.binaries import ensure_binaries
from provisioner_dev.controlplane import ControlPlane
from provisioner_dev.crds import conversion_answers
from provisioner_dev.kubectl import run_kubectl
from provisioner_dev.processes import alive, free_port
from tests.conftest import needs_own_controlplane
from tests.helpers import Kubectl, apply, assert_refused, events, get, wait_for, wait_ready

pytestmark = [pytest.mark.e2e, needs_own_controlplane]

# Without a kube-controller-manager where envtest's binaries are used (KUBEBUILDER_ASSETS).
STACK = tuple(
    name
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "moto")
    if name != "kube-controller-manager" or "kube-controller-manager" in ensure_binaries()
)


def dev(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", "dev", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )


def read_state(cwd: Path) -> dict:
    return json.loads((cwd / ".dev/state.json").read_text())


def dev_env(cwd: Path) -> dict[str, str]:
    """What `source .dev/env` exports."""
    env = {}
    for line in (cwd / ".dev/env").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


class DevCluster:
    """kubectl against the cluster of a `dev up` in `cwd`, as tests.helpers expect it."""

    def __init__(self, cwd: Path) -> None:
        self.kubeconfig = str(cwd / ".dev/kubeconfig")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = run_kubectl(self.kubeconfig, *args, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result


def sqs(moto_url: str):
    return boto3.client(
        "sqs",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def queue(name: str) -> str:
    return (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\n"
        f"metadata:\n  name: {name}\nspec: {{}}\n"
    )


def one_line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, text
    return lines[0]


def process_line(status: str, name: str) -> str:
    """The line of `dev status` about process `name`."""
    lines = [line for line in status.splitlines() if line.split()[:1] == [name]]
    assert len(lines) == 1, status
    return lines[0]


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory to run `dev up` in; whatever it started is stopped at the end."""
    yield tmp_path
    if (tmp_path / ".dev/state.json").exists():
        pids = read_state(tmp_path)["pids"]
        dev(tmp_path, "down")
        wait_for(
            lambda: not any(alive(pid) for pid in pids.values()),
            timeout=30,
            what="every process of the dev environment to stop",
        )


def test_up_is_idempotent_stale_state_is_cleaned_and_down_stops_everything(tmp_path, dev_dir):
    up = dev(tmp_path, "up", "--no-operator")
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / ".dev/state.json").read_text())
    pids = state["pids"]
    assert set(pids) == set(STACK)
    env = (tmp_path / ".dev/env").read_text()
    for key in (
        "KUBECONFIG",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert f"export {key}=" in env
    kubeconfig = tmp_path / ".dev/kubeconfig"
    ns = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "get", "crd", "queues.cloud.provisioner.dev"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ns.returncode == 0, ns.stderr

    again = dev(tmp_path, "up", "--no-operator")
    assert again.returncode == 0
    assert "already running" in again.stderr
    assert json.loads((tmp_path / ".dev/state.json").read_text())["pids"] == pids
    status = dev(tmp_path, "status")
    assert status.returncode == 0, status.stdout
    assert "not started (--no-operator)" in process_line(status.stdout, "operator")

    # A dead run: etcd and the API server die; status says so, up cleans and starts afresh.
    os.kill(pids["kube-apiserver"], 9)
    os.kill(pids["etcd"], 9)
    wait_for(lambda: not alive(pids["etcd"]), timeout=10, what="etcd to die")
    assert dev(tmp_path, "status").returncode != 0
    fresh = dev(tmp_path, "up", "--no-operator")
    assert fresh.returncode == 0, fresh.stderr
    assert "starting over" in one_line_with(fresh.stderr, "etcd and kube-apiserver are dead")
    new_pids = json.loads((tmp_path / ".dev/state.json").read_text())["pids"]
    assert not set(new_pids.values()) & set(pids.values())
    assert not any(alive(pid) for pid in pids.values()), "the stale run left processes behind"
    data_dir = Path(json.loads((tmp_path / ".dev/state.json").read_text())["data_dir"])

    down = dev(tmp_path, "down")
    assert down.returncode == 0
    wait_for(
        lambda: not any(alive(pid) for pid in new_pids.values()),
        timeout=20,
        what="every process to stop",
    )
    assert not data_dir.exists()
    assert not (tmp_path / ".dev/state.json").exists()


@pytest.mark.timeout(600)
def test_dead_operator_is_restarted_alone_and_the_cluster_kept(dev_dir):
    up = dev(dev_dir, "up")
    assert up.returncode == 0, up.stderr
    before = read_state(dev_dir)
    env_before = (dev_dir / ".dev/env").read_bytes()
    kube = DevCluster(dev_dir)
    kube.kubectl("create", "namespace", "app")
    apply(kube, "app", queue("before"))
    name = wait_ready(kube, "queue", "app", "before", timeout=120)["status"]["externalName"]
    cloud = sqs(before["moto_url"])
    assert cloud.get_queue_url(QueueName=name)["QueueUrl"]

    # The operator crashes (or is OOM-killed): status says so, and so does up, which
    # starts it alone.
    old = before["pids"]["operator"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not alive(old), timeout=10, what="the operator to die")
    status = dev(dev_dir, "status")
    assert status.returncode == 1
    assert "DEAD" in process_line(status.stdout, "operator")
    again = dev(dev_dir, "up")
    assert again.returncode == 0, again.stderr
    assert f"the operator (pid {old}) is dead" in again.stderr
    assert "starting over" not in again.stderr

    after = read_state(dev_dir)
    assert after["controlplane"]["apiserver_url"] == before["controlplane"]["apiserver_url"]
    assert after["moto_url"] == before["moto_url"]
    assert {k: after["pids"][k] for k in STACK} == {k: before["pids"][k] for k in STACK}
    assert (dev_dir / ".dev/env").read_bytes() == env_before
    new = after["pids"]["operator"]
    assert new != old and alive(new)
    assert get(kube, "queue", "app", "before") is not None
    assert cloud.get_queue_url(QueueName=name)["QueueUrl"]
    # The new operator works against the same API server and moto.
    apply(kube, "app", queue("after"))
    name = wait_ready(kube, "queue", "app", "after", timeout=120)["status"]["externalName"]
    assert cloud.get_queue_url(QueueName=name)["QueueUrl"]
    assert dev(dev_dir, "status").returncode == 0

    # `dev up --no-operator` makes room for the developer's own operator: it stops ours.
    no_operator = dev(dev_dir, "up", "--no-operator")
    assert no_operator.returncode == 0, no_operator.stderr
    assert f"stopped the operator (pid {new})" in no_operator.stderr
    assert not alive(new)
    state = read_state(dev_dir)
    assert set(state["pids"]) == set(STACK)
    assert state["controlplane"]["apiserver_url"] == before["controlplane"]["apiserver_url"]
    assert (dev_dir / ".dev/env").read_bytes() == env_before
    status = dev(dev_dir, "status")
    assert status.returncode == 0, status.stdout
    assert "not started (--no-operator)" in process_line(status.stdout, "operator")


def test_dead_moto_makes_up_start_over(dev_dir):
    up = dev(dev_dir, "up", "--no-operator")
    assert up.returncode == 0, up.stderr
    before = read_state(dev_dir)
    os.kill(before["pids"]["moto"], signal.SIGKILL)
    wait_for(lambda: not alive(before["pids"]["moto"]), timeout=10, what="moto to die")

    status = dev(dev_dir, "status")
    assert status.returncode == 1
    assert "DEAD" in process_line(status.stdout, "moto")
    again = dev(dev_dir, "up", "--no-operator")
    assert again.returncode == 0, again.stderr
    assert "starting over" in one_line_with(again.stderr, "moto is dead")
    after = read_state(dev_dir)
    assert not set(after["pids"].values()) & set(before["pids"].values())
    assert not any(alive(pid) for pid in before["pids"].values()), "the old run left processes"
    assert all(alive(pid) for pid in after["pids"].values())
    assert sqs(after["moto_url"]).list_queues().get("QueueUrls", []) == []
    assert dev(dev_dir, "status").returncode == 0


def run_own_operator(cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """`provisioner run` in a terminal where `.dev/env` was sourced (on a free liveness port)."""
    env = {**os.environ, **dev_env(cwd), "PROVISIONER_LIVENESS_PORT": str(free_port())}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "provisioner", "run"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ctrl_c(proc: subprocess.Popen[bytes], log: Path) -> None:
    """What Ctrl-C does in a terminal: SIGINT to the foreground process group; it must exit."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the operator ignored Ctrl-C; log:\n{log.read_text()}") from None


@pytest.mark.timeout(600)
def test_the_developer_loop_runs_their_own_operator_against_dev_up_no_operator(dev_dir):
    up = dev(dev_dir, "up", "--no-operator")
    assert up.returncode == 0, up.stderr
    before = read_state(dev_dir)
    kube = DevCluster(dev_dir)
    kube.kubectl("create", "namespace", "app")
    cloud = sqs(before["moto_url"])
    log = dev_dir / "own-operator.log"

    for run, name in enumerate(("first", "second")):
        proc = run_own_operator(dev_dir, log)
        try:
            # It serves the CRDs' conversion webhook (on 9443) within a few seconds of start;
            # until then a v1alpha1 resource cannot be written.
            wait_for(
                lambda: conversion_answers(dev_dir / ".dev/kubeconfig"),
                timeout=60,
                what="the operator's conversion webhook",
            )
            apply(kube, "app", queue(name))
            cr = wait_ready(kube, "queue", "app", name, timeout=120)
            assert cloud.get_queue_url(QueueName=cr["status"]["externalName"])["QueueUrl"]
        finally:
            if proc.poll() is None:
                ctrl_c(proc, log)
        assert proc.returncode == 0, f"run {run} exited with {proc.returncode}:\n{log.read_text()}"
    assert get(kube, "queue", "app", "first") is not None

    # Later, `dev up` without --no-operator starts the operator it never started, and only that.
    up = dev(dev_dir, "up")
    assert up.returncode == 0, up.stderr
    after = read_state(dev_dir)
    assert {k: after["pids"][k] for k in STACK} == {k: before["pids"][k] for k in STACK}
    assert alive(after["pids"]["operator"])
    assert dev(dev_dir, "status").returncode == 0


REQUESTED_BY = "cloud.provisioner.dev/requested-by"


def assert_trusts_the_clusters_issuer(state: dict, role_arn: str) -> None:
    """The role IRSA's pods assume trusts the IAM OIDC provider of the cluster's issuer,
    which `dev up` registered in moto."""
    iam = boto3.client(
        "iam", endpoint_url=state["moto_url"], region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    found = iam.get_role(RoleName=role_arn.rsplit("/", 1)[1])["Role"]
    (trust,) = found["AssumeRolePolicyDocument"]["Statement"]
    issuer = state["oidc_issuer"].removeprefix("https://")
    provider = f"arn:aws:iam::123456789012:oidc-provider/{issuer}"
    assert trust["Principal"] == {"Federated": provider}
    listed = iam.list_open_id_connect_providers()["OpenIDConnectProviderList"]
    assert provider in [p["Arn"] for p in listed]


@pytest.mark.timeout(600)
def test_up_runs_the_operator_as_the_chart_installs_it(dev_dir):
    """The chart's admission policies and roles are in the cluster, and the operator runs with
    spec.access (IRSA against the cluster's issuer, an IAM OIDC provider in moto)."""
    up = dev(dev_dir, "up")
    assert up.returncode == 0, up.stderr
    state = read_state(dev_dir)
    kube = DevCluster(dev_dir)
    for kind in ("mutatingadmissionpolicy", "validatingadmissionpolicy"):
        for what in (kind, f"{kind}binding"):
            kube.kubectl("get", what, "provisioner-dev-requested-by")

    # A tenant holding `edit` in its namespace (the chart's roles aggregated into it).
    kube.kubectl("create", "namespace", "app")
    tenant = "system:serviceaccount:app:tenant"
    role = "edit" if "kube-controller-manager" in STACK else "provisioner-dev-edit"
    kube.kubectl(
        "create", "rolebinding", "tenant", "-n", "app", f"--clusterrole={role}",
        "--serviceaccount=app:tenant",
    )  # fmt: skip
    wait_for(
        lambda: kube.kubectl(
            "auth", "can-i", "create", "s3buckets.cloud.provisioner.dev", f"--as={tenant}",
            "-n", "app", check=False,
        ).stdout.strip() == "yes",
        what="the edit role to cover the kinds",
    )  # fmt: skip
    kube.kubectl("create", "serviceaccount", "worker", "-n", "app")
    forged = (
        "apiVersion: cloud.provisioner.dev/v1beta1\nkind: S3Bucket\nmetadata:\n  name: shared\n"
        f"  annotations: {{{REQUESTED_BY}: system:admin}}\n"
        "spec:\n  access: [{serviceAccountName: worker, level: read}]\n"
    )
    created = kube.kubectl(
        "create", f"--as={tenant}", "-n", "app", "-f", "-", input=forged, check=False
    )
    assert created.returncode == 0, created.stderr
    cr = wait_ready(kube, "s3bucket", "app", "shared", timeout=120)
    # The forged name never lands: the API server recorded the tenant's own.
    assert cr["metadata"]["annotations"][REQUESTED_BY] == tenant
    changed = kube.kubectl(
        "annotate", "s3bucket", "shared", "-n", "app", f"--as={tenant}", "--overwrite",
        f"{REQUESTED_BY}=system:admin", check=False,
    )  # fmt: skip
    assert_refused(changed, f"{REQUESTED_BY} is recorded by the API server")
    made = wait_for(lambda: events(kube, "app", "shared", "Created"), what="the Created Event")
    assert f"(requested by {tenant})" in made[0]["message"]

    # spec.access: the role, trusting the cluster's issuer, and the ServiceAccount pointing at it.
    (grant,) = cr["status"]["access"]
    assert grant["serviceAccountName"] == "worker" and grant["level"] == "read"
    assert_trusts_the_clusters_issuer(state, grant["roleArn"])
    worker = get(kube, "serviceaccount", "app", "worker")
    assert worker["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == grant["roleArn"]
    assert dev(dev_dir, "status").returncode == 0


def test_down_takes_the_policies_out_of_a_cluster_it_did_not_start(dev_dir):
    theirs = ControlPlane(dev_dir / "theirs", ensure_binaries())
    theirs.start()
    try:
        cluster = Kubectl(theirs.kubeconfig)
        up = dev(dev_dir, "up", "--no-operator", "--kubeconfig", str(theirs.kubeconfig))
        assert up.returncode == 0, up.stderr
        objects = read_state(dev_dir)["admission"]["objects"]
        assert {resource.split(".")[0] for resource, _ in objects} >= {
            "validatingadmissionpolicy",
            "validatingadmissionpolicybinding",
            "clusterrole",
        }
        # The deletion-protection policy, with its binding, is applied too.
        assert sum(name.endswith("-deletion-protection") for _, name in objects) == 2
        for resource, name in objects:
            cluster.kubectl("get", resource, name)
        down = dev(dev_dir, "down")
        assert down.returncode == 0, down.stderr
        for resource, name in objects:
            assert cluster.kubectl("get", resource, name, check=False).returncode != 0, name
    finally:
        theirs.stop()


def test_missing_go_toolchain_is_one_clear_line(tmp_path):
    result = dev(
        tmp_path,
        "build",
        env={"PATH": "/usr/bin:/bin", "PROVISIONER_CACHE": str(tmp_path / "empty-cache")},
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Go toolchain not found" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
