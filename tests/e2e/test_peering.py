"""Two replicas: only one acts; kill it and the other takes over."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import apply, manifests, owned_cloud_resources, wait_for, wait_ready

pytestmark = pytest.mark.e2e

PEERING_CRDS = (
    Path(__file__).resolve().parents[2] / "deploy/helm/provisioner/crds/kopf-peering.yaml"
)
LIFETIME = 8


def handled(log: Path) -> set[str]:
    """Objects this operator ran the reconcile handler for (kopf logs `[ns/name] Handler ...`)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return set(re.findall(r"\[([\w.-]+/[\w.-]+)\] Handler 'reconcile' succeeded", text))


def test_two_replicas_one_acts_and_the_other_takes_over(kube, aws, own_namespace, start_operator):
    kube.kubectl("apply", "-f", str(PEERING_CRDS))
    kube.kubectl("wait", "--for=condition=Established", "-f", str(PEERING_CRDS))
    apply(
        kube,
        own_namespace,
        "apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: provisioner\n",
    )
    peering = ["--peering=provisioner", f"--peering-lifetime={LIFETIME}"]
    active = start_operator(args=[*peering, "--peering-priority=200"])
    standby = start_operator(args=[*peering, "--peering-priority=100"])

    def peers() -> list[int]:
        out = kube.kubectl("get", "kopfpeering", "provisioner", "-n", own_namespace, "-o", "json")
        return sorted(p["priority"] for p in (json.loads(out.stdout).get("status") or {}).values())

    wait_for(lambda: peers() == [100, 200], timeout=30, what="both replicas in the peering object")
    specs = [("Queue", f"q{i}", "{}") for i in range(3)]
    apply(kube, own_namespace, manifests(specs))
    for _, name, _ in specs:
        wait_ready(kube, "queue", own_namespace, name)
    assert handled(active.log) == {f"{own_namespace}/q{i}" for i in range(3)}
    assert handled(standby.log) == set()

    active.stop(kill=True)
    later = [("Queue", f"later{i}", "{}") for i in range(2)]
    apply(kube, own_namespace, manifests(later))
    for _, name, _ in later:
        cr = wait_ready(kube, "queue", own_namespace, name, timeout=LIFETIME * 6)
        assert len(owned_cloud_resources(aws, cr["metadata"]["uid"])) == 1
    assert handled(standby.log) >= {f"{own_namespace}/later{i}" for i in range(2)}
    assert "Resuming operations" in standby.log.read_text(errors="replace")
