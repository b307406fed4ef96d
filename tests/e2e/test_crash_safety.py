"""Nothing lost, nothing duplicated: kills at named points, cloud faults, API-server restarts."""

from __future__ import annotations

import json

import pytest

from provisioner.kinds.registry import KINDS
from provisioner_dev.samples import SAMPLES
from tests.conftest import shipped_cluster_role_rules
from tests.helpers import (
    apply,
    condition,
    get,
    manifests,
    merge_patch,
    owned_cloud_resources,
    secret_data,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

# One of every registered kind, from its sample (deleted without a final snapshot).
ONE_OF_EACH = [
    (
        k.kind,
        "db" if k.kind == "DatabaseInstance" else k.kind.lower(),
        json.dumps({**SAMPLES[k.kind].spec, "deletionPolicy": "Delete"}),
    )
    for k in KINDS
]
PLURAL = {k.kind: k.short_names[0] for k in KINDS}


def wait_killed(op, timeout: float = 60) -> None:
    wait_for(lambda: op.proc.poll() is not None, timeout=timeout, what="the operator to be killed")
    assert op.proc.returncode == -9, f"operator exited with {op.proc.returncode}, not SIGKILL"
    op.proc = None


def assert_one_each(kube, aws, namespace: str) -> None:
    for kind, name, _ in ONE_OF_EACH:
        cr = wait_ready(kube, PLURAL[kind], namespace, name, timeout=90)
        owned = owned_cloud_resources(aws, cr["metadata"]["uid"])
        assert owned == [(kind, cr["status"]["externalName"])], f"{kind} {name}: {owned}"
        assert secret_data(kube, namespace, f"{name}-connection")


@pytest.mark.parametrize("first", [kind for kind, _, _ in ONE_OF_EACH])
def test_killed_right_after_the_create_call_converges_to_exactly_one(
    kube, aws, own_namespace, start_operator, first
):
    """SIGKILL right after the cloud's create call returned, before any status or Secret."""
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-create"})
    ordered = sorted(ONE_OF_EACH, key=lambda spec: spec[0] != first)
    apply(kube, own_namespace, manifests(ordered[:1], "v1beta1"))
    wait_killed(doomed)
    apply(kube, own_namespace, manifests(ordered[1:], "v1beta1"))
    start_operator()
    assert_one_each(kube, aws, own_namespace)


def test_killed_between_password_and_secret_repairs_the_secret(
    kube, aws, own_namespace, start_operator
):
    from tests.e2e.test_day2 import last_password_sent

    first = start_operator()
    apply(kube, own_namespace, manifests(ONE_OF_EACH[:1], "v1beta1"))
    cr = wait_ready(kube, "dbi", own_namespace, "db")
    before = secret_data(kube, own_namespace, "db-connection")["password"]
    first.stop()
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-password-set"})
    kube.kubectl(
        "annotate",
        "dbi",
        "db",
        "-n",
        own_namespace,
        "cloud.provisioner.dev/rotate-password-at=r1",
    )
    wait_killed(doomed)
    # The cloud took a new password; the Secret still holds the old one.
    identifier = cr["status"]["externalName"]
    assert last_password_sent(kube, identifier) not in (None, before)
    assert secret_data(kube, own_namespace, "db-connection")["password"] == before
    start_operator()
    wait_for(
        lambda: (
            (o := get(kube, "dbi", own_namespace, "db"))
            and o["status"].get("lastPasswordRotation") == "r1"
        ),
        timeout=60,
        what="the rotation to complete after the restart",
    )
    final = secret_data(kube, own_namespace, "db-connection")["password"]
    assert final != before
    assert final == last_password_sent(kube, identifier)


def test_killed_mid_deletion_finishes_and_leaves_nothing(kube, aws, own_namespace, start_operator):
    first = start_operator()
    apply(kube, own_namespace, manifests(ONE_OF_EACH, "v1beta1"))
    uids = {
        name: wait_ready(kube, PLURAL[k], own_namespace, name)["metadata"]["uid"]
        for k, name, _ in ONE_OF_EACH
    }
    first.stop()
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-delete-call"})
    kube.kubectl("delete", "-n", own_namespace, "cloud", "--all", "--wait=false")
    wait_killed(doomed)
    start_operator()
    for kind, name, _ in ONE_OF_EACH:
        wait_gone(kube, PLURAL[kind], own_namespace, name, timeout=90)
        assert owned_cloud_resources(aws, uids[name]) == []
        assert secret_data(kube, own_namespace, f"{name}-connection") is None


def test_converges_under_30_percent_cloud_faults(
    kube, aws, own_namespace, start_operator, fault_proxy
):
    fault_proxy.configure(rate=0.3)
    start_operator(endpoint_url=fault_proxy.url)
    specs = [(kind, f"{name}-{i}", spec) for i in range(3) for kind, name, spec in ONE_OF_EACH]
    apply(kube, own_namespace, manifests(specs, "v1beta1"))
    uids = {}
    for kind, name, _ in specs:
        cr = wait_ready(kube, PLURAL[kind], own_namespace, name, timeout=180)
        uids[name] = cr["metadata"]["uid"]
        assert len(owned_cloud_resources(aws, uids[name])) == 1
    stats = fault_proxy.stats()
    per_cr = stats["total"] / len(specs)
    print(
        f"\nAWS calls under 30% faults: {stats['total']} for {len(specs)} CRs "
        f"({per_cr:.1f} per CR), injected {stats['injected']}: {stats['by_outcome']}"
    )
    assert stats["injected"] > 0
    # Backoff, not a hot loop: a handful of calls per step, retried a few times.
    assert per_cr < 60, stats
    kube.kubectl("delete", "-n", own_namespace, "cloud", "--all", "--wait=false")
    for kind, name, _ in specs:
        wait_gone(kube, PLURAL[kind], own_namespace, name, timeout=180)
        assert owned_cloud_resources(aws, uids[name]) == []


def test_missing_credentials_say_so_and_retain_releases(kube, own_namespace, start_operator):
    start_operator(
        env={
            "AWS_ACCESS_KEY_ID": "",
            "AWS_SECRET_ACCESS_KEY": "",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    apply(kube, own_namespace, manifests([("Queue", "nocreds", "{}")]))
    cr = wait_condition(
        kube, "queue", own_namespace, "nocreds", "Synced", "False", "ReconcileError"
    )
    assert "credentials" in condition(cr, "Synced")["message"].lower()
    # The documented way out when the account is gone for good: Retain, then delete.
    kube.kubectl("delete", "queue", "nocreds", "-n", own_namespace, "--wait=false")
    wait_condition(kube, "queue", own_namespace, "nocreds", "Ready", "False", "Deleting")
    merge_patch(kube, "queue", own_namespace, "nocreds", '{"spec":{"deletionPolicy":"Retain"}}')
    wait_gone(kube, "queue", own_namespace, "nocreds", timeout=60)


def test_cloud_resource_already_gone_releases_the_finalizer(
    kube, aws, own_namespace, start_operator
):
    op = start_operator()
    apply(kube, own_namespace, manifests([("Queue", "gone", "{}")]))
    cr = wait_ready(kube, "queue", own_namespace, "gone")
    op.stop()
    aws.sqs.delete_queue(QueueUrl=cr["status"]["queueUrl"])
    kube.kubectl("delete", "queue", "gone", "-n", own_namespace, "--wait=false")
    start_operator()
    wait_gone(kube, "queue", own_namespace, "gone")
    assert owned_cloud_resources(aws, cr["metadata"]["uid"]) == []


def test_operator_survives_an_apiserver_restart(own_stack):
    """On a control plane of its own: the restart must not reach the session operator.

    The operator runs as a ServiceAccount with the shipped ClusterRole, as it would in a
    cluster, so it also meets the 403s a restarted API server answers until its RBAC
    informers have synced, and must come through them.
    """
    kube, aws, ns = own_stack.kube, own_stack.aws, own_stack.namespace
    op = own_stack.start_operator(
        kubeconfig=kube.stack.service_account_kubeconfig(
            "provisioner-operator", shipped_cluster_role_rules()
        )
    )
    apply(kube, ns, manifests([("Queue", "before", "{}")]))
    wait_ready(kube, "queue", ns, "before")
    pid = op.proc.pid
    kube.controlplane.restart_apiserver()
    apply(kube, ns, manifests([("Queue", "after", "{}")]))
    cr = wait_ready(kube, "queue", ns, "after", timeout=120)
    assert op.proc.pid == pid and op.proc.poll() is None, "the operator restarted"
    assert len(owned_cloud_resources(aws, cr["metadata"]["uid"])) == 1
    merge_patch(kube, "queue", ns, "before", '{"spec":{"delaySeconds":3}}')
    wait_ready(kube, "queue", ns, "before", generation=2)
    attrs = aws.sqs.get_queue_attributes(
        QueueUrl=get(kube, "queue", ns, "before")["status"]["queueUrl"],
        AttributeNames=["DelaySeconds"],
    )
    assert json.dumps(attrs["Attributes"]) == '{"DelaySeconds": "3"}'
