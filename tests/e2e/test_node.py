"""The chart's pods on a real node: `helm install` on a control plane with a kubelet, containerd
and runc (provisioner_dev/node.py), the image as `make image` builds it, imported unpulled.

Two replicas with peering: both pods pass their probes; the chart installs the CRDs and the
pods serve their conversion webhook behind the chart's Service (the API server converts the
v1alpha1 resources the test writes through it); resources go Ready through them (the
in-cluster path: ServiceAccount token, `kubernetes` Service through kube-proxy); deleting the
active pod hands over to the other; the PodDisruptionBudget refuses a second eviction while one
pod is down. Skipped, with the reason, where a node or the image cannot be made here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from provisioner_dev import image
from provisioner_dev.binaries import ensure_binaries, ensure_helm
from provisioner_dev.controlplane import NODE_GATEWAY, ControlPlane
from provisioner_dev.node import Node, cannot_run
from provisioner_dev.services import MotoServer
from tests.conftest import aws_clients, needs_own_controlplane
from tests.e2e.test_helm_rbac import CHART, Helm
from tests.helpers import Kubectl, apply, manifests, wait_for, wait_ready

_WHY = cannot_run() or image.cannot_build(need_mirror=image.cached_image() is None)
pytestmark = [
    pytest.mark.e2e,
    # A first run builds the node's binaries and the image: many minutes on 2 cores.
    pytest.mark.timeout(2400),
    needs_own_controlplane,
    pytest.mark.skipif(_WHY is not None, reason=f"no node here: {_WHY}"),
]

RELEASE, NAMESPACE = "provisioner", "provisioner-system"


@dataclass
class Cluster:
    kube: Kubectl
    node: Node
    moto: MotoServer

    def pods(self) -> list[dict]:
        listed = self.kube.json("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name")
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.pods()
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]

    def active(self) -> str:
        """The pod acting now: the highest priority among the peering's live members."""
        peering = self.kube.json("get", "clusterkopfpeering", "provisioner")
        members = {k: v for k, v in (peering.get("status") or {}).items() if isinstance(v, dict)}
        live = {name: m for name, m in members.items() if name in self.ready_pods()}
        assert live, f"no live peer among {members}"
        return max(live, key=lambda name: live[name]["priority"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("node")
    cp = ControlPlane(work / "controlplane", ensure_binaries(), nodes=True)
    node = Node(work / "node", cp)
    # On every interface: the pods reach it at the node's bridge address.
    moto = MotoServer(log=work / "moto.log", host="0.0.0.0")
    try:
        cp.start()
        node.start()
        moto.start()
        ref = image.build(tag_version=False).ref
        node.load_image(ref)
        kube = Kubectl(cp.kubeconfig)
        kube.kubectl("create", "namespace", NAMESPACE)
        kube.kubectl(
            "create", "secret", "generic", "aws", "-n", NAMESPACE,
            "--from-literal=AWS_ACCESS_KEY_ID=testing",
            "--from-literal=AWS_SECRET_ACCESS_KEY=testing",
        )  # fmt: skip
        repository, tag = ref.rsplit(":", 1)
        helm = Helm(ensure_helm(), str(cp.kubeconfig), work / "helm")
        helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--set", f"image.repository={repository}",
            "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never",
            "--set", f"aws.endpointUrl=http://{NODE_GATEWAY}:{moto.port}",
            "--set", "aws.credentialsSecret=aws",
            "--set", "aws.region=us-east-1",
            "--set", "clusterId=node",
            "--set", "resyncSeconds=10",
            "--set", "logFormat=plain",
        )  # fmt: skip
        yield Cluster(kube, node, moto)
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", check=False)
    finally:
        node.stop()
        moto.stop()
        cp.stop()


def test_both_replicas_run_and_pass_their_probes(cluster: Cluster):
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="2 Ready pods")
    deployment = cluster.kube.json("get", "deployment", "-n", NAMESPACE, "-l",
                                   "app.kubernetes.io/name")["items"][0]  # fmt: skip
    assert deployment["status"].get("availableReplicas") == 2
    for pod in cluster.pods():
        spec = pod["spec"]["containers"][0]
        assert spec["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["livenessProbe"] and spec["readinessProbe"]
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and status["restartCount"] == 0, status
    # Exactly one acts: kopf's peering has both, with different priorities.
    assert cluster.active() in cluster.ready_pods()


def test_resources_go_ready_through_the_pods(cluster: Cluster):
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="2 Ready pods")
    # The pods pointed the chart's CRDs at their Service, with their CA.
    for plural in ("databaseinstances", "s3buckets", "queues", "topics"):
        crd = cluster.kube.json("get", "crd", f"{plural}.cloud.provisioner.dev")
        config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        assert config["service"]["namespace"] == NAMESPACE, config
        assert config["service"]["name"].endswith("-webhook") and config.get("caBundle")
    ns = f"app-{uuid.uuid4().hex[:6]}"
    cluster.kube.kubectl("create", "namespace", ns)
    apply(cluster.kube, ns, manifests([("Queue", "jobs", "{}"), ("S3Bucket", "files", "{}")]))
    queue = wait_ready(cluster.kube, "queue", ns, "jobs", timeout=120)
    bucket = wait_ready(cluster.kube, "s3bucket", ns, "files", timeout=120)
    aws = aws_clients(cluster.moto.url)
    assert aws.sqs.get_queue_url(QueueName=queue["status"]["externalName"])["QueueUrl"]  # type: ignore[attr-defined]
    aws.s3.head_bucket(Bucket=bucket["status"]["externalName"])  # type: ignore[attr-defined]
    assert cluster.kube.kubectl("get", "secret", "jobs-connection", "-n", ns).returncode == 0


def test_deleting_the_active_pod_hands_over(cluster: Cluster):
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="2 Ready pods")
    active = cluster.active()
    cluster.kube.kubectl("delete", "pod", active, "-n", NAMESPACE, "--wait=false")
    ns = f"fail-{uuid.uuid4().hex[:6]}"
    cluster.kube.kubectl("create", "namespace", ns)
    apply(cluster.kube, ns, manifests([("Queue", "after", "{}")]))
    # The other replica takes over once the deleted one's peering entry is gone (it leaves on
    # SIGTERM); the lease lifetime bounds it if it could not.
    wait_ready(cluster.kube, "queue", ns, "after", timeout=120)
    wait_for(lambda: active not in cluster.ready_pods(), timeout=60, what="the old pod gone")
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="a replacement pod")


def evict(cluster: Cluster, pod: str):
    body = json.dumps(
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": NAMESPACE},
        }
    )
    return cluster.kube.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction",
        "-f", "-", input=body, check=False,
    )  # fmt: skip


def test_the_disruption_budget_refuses_a_second_eviction(cluster: Cluster):
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="2 Ready pods")
    wait_for(
        lambda: (
            cluster.kube.json("get", "pdb", "-n", NAMESPACE, "-l", "app.kubernetes.io/name")[
                "items"
            ][0]["status"].get("disruptionsAllowed")
            == 1
        ),
        timeout=60,
        what="the budget to allow one disruption",
    )
    first, second = cluster.ready_pods()[:2]
    assert evict(cluster, first).returncode == 0
    refused = evict(cluster, second)
    assert refused.returncode != 0
    assert "disruption budget" in refused.stderr, refused.stderr
    wait_for(lambda: len(cluster.ready_pods()) == 2, timeout=180, what="a replacement pod")
    # Once the replacement is Ready, the budget allows the next one again.
    wait_for(lambda: evict(cluster, second).returncode == 0, timeout=60, what="eviction allowed")
