"""`provisioner dev up --kubeconfig PATH`: a cluster the developer already has (here a bare
control plane standing in for kind, k3d or a dev EKS) gets the CRDs; moto and the operator
run locally; `dev down` takes out exactly what `dev up` put in, and nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner_dev.binaries import ensure_binaries
from provisioner_dev.controlplane import ControlPlane
from provisioner_dev.crds import crd_names
from provisioner_dev.processes import alive
from tests.conftest import needs_own_controlplane
from tests.e2e.test_dev_cli import dev, read_state
from tests.helpers import Kubectl, apply, manifests, wait_for, wait_ready

pytestmark = [pytest.mark.e2e, needs_own_controlplane]


@pytest.fixture
def existing(tmp_path: Path) -> Iterator[Kubectl]:
    cp = ControlPlane(tmp_path / "theirs", ensure_binaries())
    cp.start()
    try:
        yield Kubectl(cp.kubeconfig)
    finally:
        cp.stop()


def crds(cluster: Kubectl) -> set[str]:
    listed = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    return {line.split("/", 1)[-1] for line in listed}


def test_dev_up_on_an_existing_cluster_and_down_takes_out_only_its_own(existing, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # What the developer already has there: a namespace of theirs with a ConfigMap.
    existing.kubectl("create", "namespace", "team")
    existing.kubectl("create", "configmap", "theirs", "-n", "team", "--from-literal=a=b")
    try:
        up = dev(work, "up", "--kubeconfig", existing.kubeconfig)
        assert up.returncode == 0, up.stderr
        assert "cluster:" in up.stdout and "yours" in up.stdout
        state = read_state(work)
        assert set(state["pids"]) == {"moto", "operator"}  # no control plane of ours
        assert set(crd_names()) <= crds(existing)
        env = (work / ".dev/env").read_text()
        assert f"KUBECONFIG={existing.kubeconfig}" in env

        apply(existing, "team", manifests([("Queue", "orders", "{}")]))
        cr = wait_ready(existing, "queue", "team", "orders", timeout=90)
        assert cr["status"]["queueUrl"].startswith(state["moto_url"])  # the local moto
        secret = existing.kubectl("get", "secret", "orders-connection", "-n", "team", "-o", "json")
        assert json.loads(secret.stdout)["data"]["queueUrl"]

        again = dev(work, "up", "--kubeconfig", existing.kubeconfig)
        assert again.returncode == 0, again.stderr
        assert read_state(work)["pids"] == state["pids"]
        # Another cluster, or our own control plane, needs a `dev down` first.
        other = dev(work, "up")
        assert other.returncode == 1 and "dev down" in other.stderr, other.stderr
    finally:
        down = dev(work, "down")
        assert down.returncode == 0, down.stderr

    assert not set(crd_names()) & crds(existing)
    wait_for(
        lambda: (
            existing.kubectl(
                "get", "secret", "orders-connection", "-n", "team", check=False
            ).returncode
            != 0
        ),
        timeout=60,
        what="the connection Secret to go with its Queue",
    )
    assert existing.kubectl("get", "configmap", "theirs", "-n", "team").returncode == 0
    assert all(not alive(pid) for pid in state["pids"].values())
    assert not (work / ".dev/state.json").exists()


def test_a_cluster_that_already_has_the_crds_is_refused_and_nothing_starts(kube, tmp_path):
    up = dev(tmp_path, "up", "--kubeconfig", kube.kubeconfig)
    assert up.returncode == 1
    assert "already has" in up.stderr and "queues.cloud.provisioner.dev" in up.stderr
    assert not (tmp_path / ".dev/state.json").exists()


def test_an_unreachable_cluster_is_one_line(tmp_path):
    kubeconfig = tmp_path / "gone.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "
        "'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    up = dev(tmp_path, "up", "--kubeconfig", str(kubeconfig))
    assert up.returncode == 1
    assert up.stderr.startswith("provisioner: cannot reach the cluster in")
    assert len(up.stderr.strip().splitlines()) == 1, up.stderr
