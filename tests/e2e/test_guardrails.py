"""Guardrails through the real API server: who asked (the chart's admission policies), the
standard roles and quotas, the chart's policies, plans before applying, and expiry.

The chart's admission objects are rendered with helm and applied with a namespace selector
that matches only this module's namespaces, so the rest of the suite never meets them.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from provisioner.model.resource import parse_time
from provisioner_dev.binaries import cached_helm, ensure_helm
from tests.conftest import Cluster, fresh_namespace, on_moto_only
from tests.e2e.test_drift_policy import calls, recording
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    manifests,
    merge_patch,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.timeout(300 if cached_helm() else 1200)
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "provisioner"
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
REQUESTED_BY = "cloud.provisioner.dev/requested-by"
WRITES = {"CreateQueue", "SetQueueAttributes", "TagQueue", "UntagQueue", "DeleteQueue"}


@dataclass
class Guarded:
    label: str  # key=value that selects the namespaces the policies apply to
    release: str


def render(release: str, template: str, *sets: str) -> str:
    args = [str(ensure_helm()), "template", release, str(CHART), "--namespace", "default"]
    args += ["--api-versions", MAP_API, "--show-only", f"templates/{template}"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.fixture(scope="module")
def guarded(cluster: Cluster) -> Iterator[Guarded]:
    tag = f"g{uuid.uuid4().hex[:8]}"  # never a number to `helm --set`
    release = tag
    selector = f"matchLabels.guard-test={tag}"
    docs = "\n---\n".join(
        [
            render(
                release,
                "requested-by.yaml",
                f"requestedBy.namespaceSelector.{selector}",
                f"requestedBy.validationNamespaceSelector.{selector}",
            ),
            render(release, "aggregated-roles.yaml"),
            render(
                release,
                "policy.yaml",
                "policy.enabled=true",
                "policy.allowedEngines={postgres}",
                "policy.maxStorageGiB=100",
                f"policy.namespaceSelector.{selector}",
            ),
        ]
    )
    objects = [d for d in yaml.safe_load_all(docs) if d]
    try:
        cluster.kubectl("apply", "-f", "-", input=docs)
        yield Guarded(label=f"guard-test={tag}", release=release)
    finally:
        for obj in objects:
            cluster.kubectl(
                "delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False
            )


@pytest.fixture
def guarded_namespace(cluster: Cluster, guarded: Guarded) -> Iterator[str]:
    """A t-* namespace (the session operator serves it) that the policies apply to."""
    for name in fresh_namespace(cluster, "t"):
        cluster.kubectl("label", "namespace", name, guarded.label)
        yield name


def needs_controller_manager(kube) -> None:
    if not kube.has_controller_manager:
        pytest.skip("no kube-controller-manager (envtest's binaries): no role aggregation or quota")


def developer(kube, namespace: str, name: str, role: str = "edit") -> str:
    """A ServiceAccount bound to a standard role in `namespace` (the chart's roles are
    aggregated into it by the controller manager); its token."""
    needs_controller_manager(kube)
    kube.kubectl("create", "serviceaccount", name, "-n", namespace)
    kube.kubectl(
        "create",
        "rolebinding",
        name,
        f"--clusterrole={role}",
        f"--serviceaccount={namespace}:{name}",
        "-n",
        namespace,
    )
    who = f"system:serviceaccount:{namespace}:{name}"
    wait_for(
        lambda: can_i(kube, who, "get", "queues.cloud.provisioner.dev", namespace),
        what=f"the {role} role to cover the kinds (aggregation)",
    )
    return kube.kubectl("create", "token", name, "-n", namespace).stdout.strip()


def can_i(kube, who: str, verb: str, resource: str, namespace: str) -> bool:
    result = kube.kubectl(
        "auth", "can-i", verb, resource, f"--as={who}", "-n", namespace, check=False
    )
    return result.stdout.strip() == "yes"


def dry_run(kube, namespace: str, manifest: str):
    return try_apply(kube, namespace, manifest, "--dry-run=server")


def visibility(aws, url: str) -> str:
    """The queue's VisibilityTimeout as the cloud holds it."""
    found = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    return found["Attributes"]["VisibilityTimeout"]


# -- who asked ------------------------------------------------------------------------------


def test_requested_by_is_stamped_by_the_api_server_and_nobody_changes_it(
    kube, guarded, own_namespace, start_operator
):
    # An operator told that the annotation is checked (as the chart tells it).
    ns = own_namespace
    kube.kubectl("label", "namespace", ns, guarded.label)
    operator = start_operator(args=["--requested-by=verified"])
    token = developer(kube, ns, "dev")
    who = f"system:serviceaccount:{ns}:dev"
    forged = (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\n"
        f"metadata:\n  name: jobs\n  annotations:\n    {REQUESTED_BY}: someone-else\nspec: {{}}\n"
    )

    def stamped_in_dry_run():
        probe = forged.replace("name: jobs", "name: probe")
        result = kube.kubectl_as(
            token, "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-", input=probe
        )
        if result.returncode != 0:
            # The validating policy may be loaded before the mutating one that overwrites
            # the forged value: that refusal means "not yet", anything else is a failure.
            assert "only its creator may set it" in result.stderr, result.stderr
            return False
        return json.loads(result.stdout)["metadata"]["annotations"].get(REQUESTED_BY) == who

    # The policies take effect once the API server has loaded both of them.
    wait_for(stamped_in_dry_run, what="the API server to stamp requested-by")
    created = kube.kubectl_as(token, "apply", "-n", ns, "-f", "-", input=forged)
    assert created.returncode == 0, created.stderr
    assert get(kube, "queue", ns, "jobs")["metadata"]["annotations"][REQUESTED_BY] == who
    wide = kube.kubectl("get", "cloud", "-n", ns, "-o", "wide").stdout
    assert "REQUESTED-BY" in wide.splitlines()[0] and who in wide

    other = developer(kube, ns, "other")
    refused = kube.kubectl_as(
        other, "annotate", "queue", "jobs", "-n", ns, "--overwrite", f"{REQUESTED_BY}=other"
    )
    assert refused.returncode != 0
    assert "cannot be changed" in refused.stderr and who in refused.stderr
    as_admin = kube.kubectl("annotate", "queue", "jobs", "-n", ns, f"{REQUESTED_BY}-", check=False)
    assert as_admin.returncode != 0 and "cannot be changed" in as_admin.stderr

    # Events about the cloud change name who asked.
    wait_ready(kube, "queue", ns, "jobs")
    made = wait_for(
        lambda: events(kube, ns, "jobs", "Created"),
        what="the Created Event",
    )
    assert f"(requested by {who})" in made[0]["message"]
    log = operator.log.read_text(errors="replace")
    assert f"{ns}/jobs Created" in log and who in log


# -- the standard roles and quotas ------------------------------------------------------------


def test_view_reads_the_kinds_and_edit_makes_them(kube, guarded_namespace, guarded):
    ns = guarded_namespace
    developer(kube, ns, "viewer", role="view")
    viewer, editor = (f"system:serviceaccount:{ns}:{n}" for n in ("viewer", "editor"))
    developer(kube, ns, "editor")
    for plural in ("databaseinstances", "s3buckets", "queues", "topics"):
        resource = f"{plural}.cloud.provisioner.dev"
        assert can_i(kube, viewer, "list", resource, ns)
        assert not can_i(kube, viewer, "create", resource, ns)
        assert can_i(kube, editor, "create", resource, ns)
        assert can_i(kube, editor, "delete", resource, ns)
    assert not can_i(kube, viewer, "get", "secrets", ns)
    assert not can_i(kube, editor, "create", "cloudaccounts.cloud.provisioner.dev", ns)


def test_a_resource_quota_counts_the_kinds(kube, guarded_namespace):
    needs_controller_manager(kube)  # it counts the usage the admission check relies on
    ns = guarded_namespace
    kube.kubectl(
        "create", "quota", "cloud", "-n", ns, "--hard=count/queues.cloud.provisioner.dev=1"
    )
    wait_for(
        lambda: (
            (q := get(kube, "resourcequota", ns, "cloud"))
            and "count/queues.cloud.provisioner.dev" in (q.get("status") or {}).get("used", {})
        ),
        what="the quota's usage to be counted",
        # The quota controller discovers a custom kind within 30 s and then counts it.
        timeout=120,
    )
    apply(kube, ns, manifests([("Queue", "first", "{}")]))
    second = try_apply(kube, ns, manifests([("Queue", "second", "{}")]))
    assert_refused(second, "exceeded quota")
    assert "count/queues.cloud.provisioner.dev" in second.stderr


# -- the chart's policies ---------------------------------------------------------------------

DATABASE = "{{engine: {engine}, instanceClass: {cls}, allocatedStorageGiB: {gib}{extra}}}"


def database(engine="postgres", cls="db.t3.micro", gib=20, extra="") -> str:
    return manifests(
        [("DatabaseInstance", "db", DATABASE.format(engine=engine, cls=cls, gib=gib, extra=extra))]
    )


def test_each_policy_refuses_with_its_rule_and_allows_what_it_should(kube, guarded_namespace):
    ns = guarded_namespace
    public_bucket = manifests([("S3Bucket", "b", "{blockPublicAccess: false}")])
    # Two policies (databases, buckets), each loaded by the API server in its own time.
    wait_for(
        lambda: (
            "rule allowed-engines" in dry_run(kube, ns, database(engine="mysql")).stderr
            and "rule no-public-buckets" in dry_run(kube, ns, public_bucket).stderr
        ),
        what="the policies to be loaded",
    )
    refusals = [
        (
            database(engine="mysql"),
            "rule allowed-engines: engine mysql is not allowed in namespace "
            + ns
            + " (allowed: postgres)",
        ),
        (
            database(gib=200),
            f"rule max-storage: 200 GiB is more than namespace {ns} allows (100 GiB)",
        ),
        (database(extra=", publiclyAccessible: true"), "rule no-public-databases"),
        (public_bucket, "rule no-public-buckets"),
    ]
    for manifest, message in refusals:
        assert_refused(dry_run(kube, ns, manifest), message)
    assert dry_run(kube, ns, database()).returncode == 0
    assert dry_run(kube, ns, database(extra=", deletionPolicy: Delete")).returncode == 0

    # The namespace's own limits, set by whoever may edit namespaces.
    kube.kubectl(
        "annotate",
        "namespace",
        ns,
        "cloud.provisioner.dev/allowed-engines=mysql, mariadb",
        "cloud.provisioner.dev/allowed-instance-classes=db.t3.micro",
        "cloud.provisioner.dev/max-storage-gib=500",
    )
    kube.kubectl(
        "label",
        "namespace",
        ns,
        "cloud.provisioner.dev/allow-public=true",
        "cloud.provisioner.dev/environment=production",
    )

    def refused_now(manifest: str, message: str) -> bool:
        result = dry_run(kube, ns, manifest)
        return result.returncode != 0 and message in result.stderr

    wait_for(lambda: refused_now(database(), "rule allowed-engines"), what="the namespace's limits")
    assert "(allowed: mysql, mariadb)" in dry_run(kube, ns, database()).stderr
    assert refused_now(
        database(engine="mysql", cls="db.m5.large"),
        "rule allowed-instance-classes: instance class db.m5.large",
    )
    assert refused_now(
        database(engine="mysql", extra=", deletionPolicy: Delete"),
        "rule production-databases-keep-data",
    )
    allowed = database(
        engine="mysql", gib=400, extra=", publiclyAccessible: true, deletionPolicy: Snapshot"
    )
    assert dry_run(kube, ns, allowed).returncode == 0, dry_run(kube, ns, allowed).stderr
    assert (
        dry_run(kube, ns, manifests([("S3Bucket", "b", "{blockPublicAccess: false}")])).returncode
        == 0
    )


# -- plans ------------------------------------------------------------------------------------


def queue_writes(kube, name: str, since: int) -> list[str]:
    return [t for action in WRITES for t in calls(kube, name, action, since)]


@on_moto_only
def test_a_plan_writes_nothing_and_removing_the_annotation_applies_it(
    kube, operator, aws, namespace
):
    ns = namespace
    before = len(recording(kube))
    planned = (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: planned\n"
        '  annotations:\n    cloud.provisioner.dev/plan-only: "true"\n'
        "spec: {visibilityTimeoutSeconds: 30}\n"
    )
    apply(kube, ns, planned)
    cr = wait_for(
        lambda: (o := get(kube, "queue", ns, "planned")) and o.get("status", {}).get("plan") and o,
        what="a plan",
    )
    name = cr["metadata"]["name"]
    plan = cr["status"]["plan"]
    assert plan["action"] == "Create" and plan["generation"] == 1
    assert condition(cr, "Synced")["reason"] == "PlanOnly"
    assert "PLAN" in kube.kubectl("get", "queue", "-n", ns).stdout.splitlines()[0]
    cloud_name = plan["reason"].split()[2]
    assert queue_writes(kube, cloud_name, before) == []
    assert aws.sqs.list_queues(QueueNamePrefix=cloud_name).get("QueueUrls") is None

    kube.kubectl("annotate", "queue", name, "-n", ns, "cloud.provisioner.dev/plan-only-")
    cr = wait_ready(kube, "queue", ns, name)
    assert "plan" not in cr["status"]
    url = cr["status"]["queueUrl"]

    # An edit, planned: the plan names the field with both values; nothing is written.
    kube.kubectl("annotate", "queue", name, "-n", ns, "cloud.provisioner.dev/plan-only=true")
    mark = len(recording(kube))
    merge_patch(kube, "queue", ns, name, '{"spec":{"visibilityTimeoutSeconds":60}}')
    cr = wait_for(
        lambda: (
            (o := get(kube, "queue", ns, name))
            and (o["status"].get("plan") or {}).get("generation") == 2
            and o
        ),
        what="the plan of the edit",
    )
    assert cr["status"]["plan"]["action"] == "Update"
    assert cr["status"]["plan"]["changes"] == [
        {"field": "spec.visibilityTimeoutSeconds", "cloud": "30", "spec": "60"}
    ]
    assert queue_writes(kube, cloud_name, mark) == []
    assert visibility(aws, url) == "30"
    # A drifted cloud while planning: the plan shows the cloud's value.
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "45"})
    drift_index = len(recording(kube))
    kube.kubectl(
        "annotate",
        "queue",
        name,
        "-n",
        ns,
        "--overwrite",
        "cloud.provisioner.dev/reconcile-requested-at=plan-2",
    )
    wait_for(
        lambda: any(
            c.get("cloud") == "45"
            for c in (
                (get(kube, "queue", ns, name)["status"].get("plan") or {}).get("changes") or []
            )
        ),
        what="the plan to show the drifted value",
    )
    operator_writes = queue_writes(kube, cloud_name, drift_index)
    assert operator_writes == [], operator_writes

    kube.kubectl("annotate", "queue", name, "-n", ns, "cloud.provisioner.dev/plan-only-")
    wait_for(
        lambda: visibility(aws, url) == "60",
        what="the planned change to be applied",
    )
    wait_ready(kube, "queue", ns, name, generation=2)


@on_moto_only
def test_applying_says_what_changed_since_the_plan(kube, operator, aws, namespace):
    ns = namespace
    apply(kube, ns, manifests([("Queue", "moving", "{visibilityTimeoutSeconds: 30}")]))
    cr = wait_ready(kube, "queue", ns, "moving")
    url = cr["status"]["queueUrl"]
    kube.kubectl("annotate", "queue", "moving", "-n", ns, "cloud.provisioner.dev/plan-only=true")
    wait_condition(kube, "queue", ns, "moving", "Synced", "False", "PlanOnly")
    assert get(kube, "queue", ns, "moving")["status"]["plan"]["action"] == "None"
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "50"})
    kube.kubectl("annotate", "queue", "moving", "-n", ns, "cloud.provisioner.dev/plan-only-")
    changed = wait_for(
        lambda: events(kube, ns, "moving", "PlanChanged"),
        what="a PlanChanged Event",
    )
    assert "the plan said None, the cloud now needs Update" in changed[0]["message"]
    wait_for(
        lambda: visibility(aws, url) == "30",
        what="the spec to be applied",
    )


# -- expiry -----------------------------------------------------------------------------------


@on_moto_only
def test_a_ttl_expires_with_the_event_first_and_the_deletion_policy_honoured(
    kube, operator, aws, namespace
):
    ns = namespace
    apply(
        kube,
        ns,
        manifests(
            [
                ("Queue", "short", "{ttl: 30s}"),
                ("S3Bucket", "kept", "{ttl: 30s, deletionPolicy: Retain}"),
                ("Queue", "extended", "{ttl: 30s}"),
            ]
        ),
    )
    short, kept = wait_ready(kube, "queue", ns, "short"), wait_ready(kube, "s3b", ns, "kept")
    merge_patch(kube, "queue", ns, "extended", '{"spec":{"ttl":"1h"}}')
    created = short["metadata"]["creationTimestamp"]
    expected = parse_time(created).timestamp() + 30
    assert parse_time(short["status"]["expiresAt"]).timestamp() == expected
    assert "EXPIRES" in kube.kubectl("get", "queue", "-n", ns).stdout.splitlines()[0]

    # Half the lifetime before (the default warning, an hour, is longer than that).
    expiring = wait_condition(
        kube, "queue", ns, "short", "Expiring", "True", "ExpiresSoon", timeout=40
    )
    assert get(kube, "queue", ns, "short")["metadata"].get("deletionTimestamp") is None
    warned = events(kube, ns, "short", "Expiring")
    assert warned and warned[0]["type"] == "Warning"
    assert "deletionPolicy Delete" in condition(expiring, "Expiring")["message"]

    wait_gone(kube, "queue", ns, "short", timeout=60)
    wait_gone(kube, "s3b", ns, "kept", timeout=60)
    assert (
        aws.sqs.list_queues(QueueNamePrefix=short["status"]["externalName"]).get("QueueUrls")
        is None
    )
    aws.s3.head_bucket(Bucket=kept["status"]["externalName"])  # Retain: still there
    aws.s3.delete_bucket(Bucket=kept["status"]["externalName"])
    extended = get(kube, "queue", ns, "extended")
    assert extended is not None and extended["metadata"].get("deletionTimestamp") is None
    born = parse_time(extended["metadata"]["creationTimestamp"]).timestamp()
    assert parse_time(extended["status"]["expiresAt"]).timestamp() == born + 3600
    assert condition(extended, "Expiring")["status"] == "False"


def test_ttl_and_expires_at_are_exclusive(kube, namespace):
    both = "{ttl: 1h, expiresAt: '2030-01-01T00:00:00Z'}"
    assert_refused(
        try_apply(kube, namespace, manifests([("Queue", "q", both)])),
        "spec.ttl and spec.expiresAt are exclusive",
    )
    assert_refused(
        try_apply(kube, namespace, manifests([("Queue", "q", "{ttl: 3 days}")])), "spec.ttl"
    )
