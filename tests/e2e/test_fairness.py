"""Fairness between namespaces: one namespace's burst does not hold up another's resource;
and the chart's tenant quota caps how many resources of each kind a namespace may hold.

An operator of the test's own watches two namespaces. One gets FLOOD Queues at once, the
other a single Queue right after. A Queue's pass reads its tags (`ListQueueTags`, 5 calls
per second per account in the call budget), so the flood takes FLOOD / 5 seconds to be
Ready; first come, first served, the single Queue would wait for most of it. Each namespace
in turn, it goes at once: a free pass slot (the flood's namespace holds at most its cap of
them) and a spare token of the call budget.

The order is read from one WATCH of both namespaces' Queues (events come in the order the
API server wrote them), not from clocks: "how many of the flood became Ready between the
single Queue's creation and its Ready" holds on a loaded machine too.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner_dev.binaries import ensure_helm
from provisioner_dev.kubejson import KubeJson
from tests.conftest import Cluster, fresh_namespace
from tests.e2e.conftest import operators
from tests.helpers import get, manifests, wait_for

pytestmark = pytest.mark.e2e

QUEUES = "/apis/cloud.provisioner.dev/v1beta1/queues"
FLOOD = 100
# Of the flood, at most this many became Ready between the single Queue's creation and its
# Ready. Measured on a 2-core machine: 0 or 1 each namespace in turn; 61 and 62 first come,
# first served (the single Queue waited for a pass slot behind the flood's, then for the call
# budget behind the calls already waiting). At 5 Queues a second, 20 is 4 seconds.
AT_MOST = 20


class ReadyOrder:
    """The Queues of `namespaces` in the order the API server showed them created and Ready."""

    def __init__(self, kubeconfig: str, namespaces: set[str]) -> None:
        self.api = KubeJson(kubeconfig, pool_size=2)
        self.namespaces = namespaces
        self.events: list[tuple[str, str, str]] = []  # (what, namespace, name)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.version = str(self.api.json("GET", QUEUES)["metadata"]["resourceVersion"])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _seen(self, what: str, namespace: str, name: str) -> None:
        with self.lock:
            if (what, namespace, name) not in self.events:
                self.events.append((what, namespace, name))

    def _item(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") not in self.namespaces:
            return
        self._seen("created", meta["namespace"], meta["name"])
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            self._seen("ready", meta["namespace"], meta["name"])

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                if not self.version:  # the version is gone (410): list again, then watch on
                    listing = self.api.json("GET", QUEUES)
                    for item in listing.get("items") or []:
                        self._item(item)
                    self.version = str(listing["metadata"]["resourceVersion"])
                for event in self.api.watch(QUEUES, self.version, timeout_seconds=5):
                    obj: dict[str, Any] = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        self.version = ""
                        break
                    meta = obj.get("metadata") or {}
                    self.version = meta.get("resourceVersion") or self.version
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._item(obj)
            except RuntimeError:
                self.stopped.wait(0.5)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)

    def ready_between(self, namespace: str, name: str, other: str) -> tuple[int] | None:
        """(How many of `other`'s Queues became Ready after `namespace/name` was created and
        before it was Ready,); None while it is not Ready."""
        with self.lock:
            events = list(self.events)
        if ("ready", namespace, name) not in events:
            return None
        start = events.index(("created", namespace, name))
        end = events.index(("ready", namespace, name))
        return (sum(1 for what, ns, _ in events[start:end] if what == "ready" and ns == other),)


@pytest.fixture
def two_namespaces(cluster: Cluster) -> Iterator[tuple[str, str]]:
    flood = fresh_namespace(cluster, "own")
    single = fresh_namespace(cluster, "own")
    yield next(flood), next(single)
    for namespace in (flood, single):
        next(namespace, None)


def queues(namespace: str, names: list[str]) -> str:
    return "".join(
        f"---\napiVersion: cloud.provisioner.dev/v1beta1\nkind: Queue\n"
        f"metadata: {{name: {name}, namespace: {namespace}}}\n"
        "spec: {visibilityTimeoutSeconds: 30}\n"
        for name in names
    )


def test_a_burst_in_one_namespace_does_not_hold_up_another_namespace(
    cluster: Cluster, two_namespaces: tuple[str, str]
) -> None:
    flood_ns, single_ns = two_namespaces
    with operators(cluster, flood_ns) as start:
        start(args=[f"--namespace={single_ns}"])
        order = ReadyOrder(cluster.kubeconfig, {flood_ns, single_ns})
        try:
            names = [f"q{i:03d}" for i in range(FLOOD)]
            cluster.kubectl("create", "-f", "-", input=queues(flood_ns, names), timeout=120)
            cluster.kubectl("create", "-f", "-", input=queues(single_ns, ["single"]))
            (between,) = wait_for(
                lambda: order.ready_between(single_ns, "single", flood_ns),
                timeout=FLOOD / 5 * 3,
                what="the single Queue Ready",
            )
            assert between <= AT_MOST, f"{between} of the flood went first: {order.events}"
        finally:
            order.stop()
            # Gone before the operator stops, so that nothing is left in the cloud.
            cluster.kubectl("delete", "queues", "--all", "-n", flood_ns, "--wait=false")
            cluster.kubectl("delete", "queues", "--all", "-n", single_ns, "--wait=false")
            wait_for(
                lambda: (
                    not cluster.kubectl(
                        "get", "queues", "-n", flood_ns, "-o", "name"
                    ).stdout.strip()
                    or None
                ),
                timeout=FLOOD / 5 * 4,
                what="the flood deleted",
            )


# -- the chart's tenant quota -----------------------------------------------------------------

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "provisioner"
KINDS = {
    "DatabaseInstance": "{engine: postgres, instanceClass: db.t3.micro, storage: {sizeGiB: 20}}",
    "S3Bucket": "{}",
    "Queue": "{}",
    "Topic": "{}",
}
PLURALS = {
    "DatabaseInstance": "databaseinstances",
    "S3Bucket": "s3buckets",
    "Queue": "queues",
    "Topic": "topics",
}


def tenant_quota(namespace: str, values: Path) -> str:
    """templates/tenant-quota.yaml as the chart renders it for `namespace`."""
    args = [str(ensure_helm()), "template", "fair", str(CHART), "--namespace", "default"]
    args += ["--show-only", "templates/tenant-quota.yaml", "--values", str(values)]
    args += ["--set", f"tenantQuota.namespaces={{{namespace}}}"]
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout


def as_tenant(cluster: Cluster, namespace: str) -> str:
    """`system:serviceaccount:<namespace>:tenant`, who may write the kinds there and nothing
    else (what the chart's roles give `edit`); its name for kubectl's --as."""
    resources = ",".join(f"{p}.cloud.provisioner.dev" for p in PLURALS.values())
    cluster.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
    cluster.kubectl(
        "create", "role", "cloud-edit", "-n", namespace, f"--resource={resources}",
        "--verb=get,list,watch,create,update,patch,delete",
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "tenant", "-n", namespace, "--role=cloud-edit",
        f"--serviceaccount={namespace}:tenant",
    )  # fmt: skip
    return f"system:serviceaccount:{namespace}:tenant"


def test_the_chart_s_tenant_quota_counts_each_kind_and_refuses_a_create_past_it(
    cluster: Cluster, own_namespace: str, tmp_path: Path
) -> None:
    if not cluster.has_controller_manager:
        pytest.skip("no kube-controller-manager (envtest's binaries): no quota status")
    ns = own_namespace  # no operator acts here: the quota is the API server's alone
    # The chart's recommended counts, but for queues: 2, so that the test reaches it.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["tenantQuota"]["hard"]
    assert set(defaults) == {f"count/{p}.cloud.provisioner.dev" for p in PLURALS.values()}
    values = tmp_path / "values.yaml"
    hard = {**defaults, "count/queues.cloud.provisioner.dev": 2}
    values.write_text(yaml.safe_dump({"tenantQuota": {"hard": hard}}))
    cluster.kubectl("apply", "-f", "-", input=tenant_quota(ns, values))
    quota = "fair-provisioner-tenant-quota"

    def counted() -> bool:
        status = (get(cluster, "resourcequota", ns, quota) or {}).get("status") or {}
        return set(status.get("used") or {}) == set(hard)

    # The quota controller discovers a custom kind within 30 s and then counts it; until then
    # the admission check refuses every create ("status unknown for quota").
    wait_for(counted, what="the quota's usage of every kind to be counted", timeout=120)
    tenant = as_tenant(cluster, ns)
    wait_for(
        lambda: cluster.kubectl(
            "auth", "can-i", "create", "queues.cloud.provisioner.dev", f"--as={tenant}", "-n", ns,
            check=False,
        ).stdout.strip() == "yes",
        what="the tenant's role",
    )  # fmt: skip
    for kind, spec in KINDS.items():
        document = manifests([(kind, f"{kind.lower()}-1", spec)], version="v1beta1")
        cluster.kubectl("apply", "-n", ns, f"--as={tenant}", "-f", "-", input=document)
    second = manifests([("Queue", "queue-2", "{}")], version="v1beta1")
    cluster.kubectl("apply", "-n", ns, f"--as={tenant}", "-f", "-", input=second)
    # Each kind is counted under the name the chart gives it.
    used = (get(cluster, "resourcequota", ns, quota) or {})["status"]["used"]
    assert used == {
        "count/databaseinstances.cloud.provisioner.dev": "1",
        "count/s3buckets.cloud.provisioner.dev": "1",
        "count/queues.cloud.provisioner.dev": "2",
        "count/topics.cloud.provisioner.dev": "1",
    }
    third = manifests([("Queue", "queue-3", "{}")], version="v1beta1")
    refused = cluster.kubectl(
        "apply", "-n", ns, f"--as={tenant}", "-f", "-", input=third, check=False
    )
    assert refused.returncode != 0
    assert "exceeded quota" in refused.stderr
    assert "count/queues.cloud.provisioner.dev" in refused.stderr
    assert get(cluster, "queue", ns, "queue-3") is None
