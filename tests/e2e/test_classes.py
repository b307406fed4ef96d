"""ResourceClasses through the API server against moto: a platform team's default class per
namespace label, what a developer's bare resource gets from it (read back with boto3), the
chart's admission policy refusing an enforced field, class edits applied to the resources
that use it, and a class in use that waits before it goes.

Classes are cluster-scoped and the control plane is shared: each test's classes select only
its own namespace, by a label of its own."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from provisioner_dev.binaries import REPO_ROOT, cached_helm, ensure_helm
from tests.e2e.test_database_network import Vpc
from tests.helpers import (
    apply,
    condition,
    events,
    get,
    resource_class,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600 if cached_helm() else 1500)]

GROUP = "cloud.provisioner.dev"
CHART = REPO_ROOT / "deploy" / "helm" / "provisioner"


@pytest.fixture
def vpc(aws) -> Vpc:
    return Vpc(aws.rds.meta.endpoint_url)


@pytest.fixture
def team(kube, namespace) -> Iterator[tuple[str, dict[str, str]]]:
    """The test's namespace with a label of its own, and a selector of that label; its
    classes (those that select it, or bear the label's value in their name) are deleted at
    the end (a class in use waits for its resources first)."""
    label = {"class-test": f"c{uuid.uuid4().hex[:8]}"}
    kube.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in label.items()))
    yield namespace, label
    found = kube.kubectl("get", "rclass", "-o", "json").stdout
    for item in yaml.safe_load(found)["items"]:
        name = item["metadata"]["name"]
        selects = (item["spec"].get("namespaceSelector") or {}).get("matchLabels") == label
        if selects or label["class-test"] in name:
            kube.kubectl("delete", "rclass", name, "--wait=false", check=False)
            # The keeper that held its finalizer is stopped by now.
            kube.kubectl(
                "patch", "rclass", name, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip


@pytest.fixture
def keeper(start_operator):
    """An operator that keeps ResourceClasses (status, finalizer), as the replica that keeps
    CloudAccounts does; the session operator is namespaced and keeps neither."""
    return start_operator(args=["--manage-accounts=on"])


def cr(kind: str, name: str, spec: dict[str, Any], annotations: dict | None = None) -> str:
    meta: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    body = {"apiVersion": f"{GROUP}/v1beta1", "kind": kind, "metadata": meta, "spec": spec}
    return yaml.safe_dump(body)


def apply_class(kube, manifest: str) -> None:
    kube.kubectl("apply", "-f", "-", input=manifest)


def class_ready(kube, name: str) -> dict[str, Any]:
    return wait_for(
        lambda: (c := get_class(kube, name)) and condition(c, "Ready") and c,
        what=f"ResourceClass {name} to be checked",
    )


def get_class(kube, name: str) -> dict[str, Any] | None:
    done = kube.kubectl("get", "rclass", name, "-o", "json", check=False)
    return yaml.safe_load(done.stdout) if done.returncode == 0 else None


def test_a_bare_database_gets_the_default_class_of_its_namespace(kube, operator, vpc, team, keeper):
    namespace, label = team
    name = f"prod-postgres-{label['class-test']}"
    group = f"private-db-{label['class-test']}"
    vpc.rds.create_db_subnet_group(
        DBSubnetGroupName=group, DBSubnetGroupDescription="private", SubnetIds=vpc.subnets
    )
    apply_class(
        kube,
        resource_class(
            name,
            "DatabaseInstance",
            label,
            default=True,
            defaults={
                "network": {"subnetGroupName": group},
                "encryption": {"kmsKeyId": vpc.key},
                "deletionProtection": True,
                "backupRetentionDays": 14,
                "deletionPolicy": "Delete",
            },
            enforced=["network", "encryption", "deletionProtection"],
            tags={"cost-center": "4711"},
        ),
    )
    assert condition(class_ready(kube, name), "Ready")["status"] == "True"

    bare = {"engine": "postgres", "instanceClass": "db.t3.micro", "tags": {"team": "orders"}}
    apply(kube, namespace, cr("DatabaseInstance", "orders", bare))
    got = wait_ready(kube, "dbi", namespace, "orders", timeout=90)
    assert got["status"]["class"]["name"] == name
    assert got["spec"].get("network") is None  # the resource stays as written
    instance = vpc.instance(got["status"]["externalName"])
    assert instance["DBSubnetGroup"]["DBSubnetGroupName"] == group
    assert instance["StorageEncrypted"] is True and instance["KmsKeyId"] == vpc.key
    assert instance["DeletionProtection"] is True
    assert instance["BackupRetentionPeriod"] == 14
    tags = vpc.tags(instance["DBInstanceArn"])
    assert tags["cost-center"] == "4711" and tags["team"] == "orders"
    listed = kube.kubectl("get", "dbi", "orders", "-n", namespace).stdout
    assert "CLASS" in listed.splitlines()[0] and name in listed.splitlines()[1]

    # Without the chart's policy, the operator refuses an enforced field set otherwise.
    network = {"subnetGroupName": "somewhere-else"}
    apply(kube, namespace, cr("DatabaseInstance", "rogue", {**bare, "network": network}))
    refused = wait_condition(kube, "dbi", namespace, "rogue", "Synced", "False", "InvalidSpec")
    assert condition(refused, "Synced")["message"] == (
        f"spec.network is set by ResourceClass {name}"
    )
    kube.kubectl("delete", "dbi", "rogue", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "rogue")

    # The class in use waits, and says who uses it.
    kube.kubectl("delete", "rclass", name, "--wait=false")
    said = wait_for(
        lambda: [
            e
            for e in class_events(kube, name)
            if e["reason"] == "InUse" and f"{namespace}/DatabaseInstance/orders" in e["message"]
        ],
        what="the InUse Event of the class",
    )
    assert said[0]["type"] == "Warning"
    assert get_class(kube, name) is not None
    # Its deletion protection comes from the class, which enforces it: the resource cannot
    # turn it off (false is the schema default, left to the class); the class can.
    kube.kubectl("delete", "dbi", "orders", "-n", namespace, "--wait=false")
    held = wait_condition(kube, "dbi", namespace, "orders", "Synced", "False", "DeletionProtected")
    assert f"set by ResourceClass {name}" in condition(held, "Synced")["message"]
    kube.kubectl(
        "patch", "rclass", name, "--type=json", "-p",
        '[{"op":"remove","path":"/spec/defaults/deletionProtection"},'
        '{"op":"replace","path":"/spec/enforced","value":["network","encryption"]}]',
    )  # fmt: skip
    wait_gone(kube, "dbi", namespace, "orders", timeout=120)
    assert vpc.instance(got["status"]["externalName"]) is None
    wait_for(lambda: get_class(kube, name) is None, timeout=90, what="the class to go")


def class_events(kube, name: str) -> list[dict[str, Any]]:
    found = kube.kubectl(
        "get", "events", "-A", "--field-selector",
        f"involvedObject.kind=ResourceClass,involvedObject.name={name}", "-o", "json",
    ).stdout  # fmt: skip
    return list(yaml.safe_load(found)["items"])


def render(release: str, template: str) -> list[dict]:
    args = [str(ensure_helm()), "template", release, str(CHART)]
    args += ["--namespace", "class-ops", "--show-only", f"templates/{template}"]
    done = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture
def class_policies(kube) -> Iterator[None]:
    """The chart's ResourceClass policies (their classes select their own namespaces)."""
    docs = render(f"c{uuid.uuid4().hex[:6]}", "resource-classes.yaml")
    assert len(docs) == 10
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield
    finally:
        for doc in docs:
            kube.kubectl(
                "delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False
            )


def test_the_chart_policy_refuses_an_enforced_field_at_apply(kube, class_policies, team):
    namespace, label = team
    name = f"fifo-only-{label['class-test']}"
    apply_class(
        kube,
        resource_class(
            name,
            "Queue",
            label,
            default=True,
            defaults={"fifo": True, "visibilityTimeoutSeconds": 60},
            enforced=["fifo", "messageRetentionSeconds"],
        ),
    )
    wrong = cr("Queue", "plain", {"fifo": False, "messageRetentionSeconds": 600})
    # The API server loads a new policy (and a new parameter) within seconds: a dry run
    # probes until it is enforced.
    refused = wait_for(
        lambda: (
            (done := try_apply(kube, namespace, wrong, "--dry-run=server")).returncode != 0 and done
        ),
        timeout=60,
        what="the class policy to be enforced",
    )
    assert f"spec.messageRetentionSeconds is set by ResourceClass {name}" in refused.stderr
    # fifo: false is the schema default: left to the class, not refused.
    assert "spec.fifo" not in refused.stderr
    # What the class has, or nothing at all, passes; so does another namespace's resource.
    same = cr("Queue", "same", {"fifo": True})
    assert try_apply(kube, namespace, same, "--dry-run=server").returncode == 0
    assert try_apply(kube, "default", wrong, "--dry-run=server").returncode == 0


def test_editing_a_class_updates_the_queues_that_use_it(kube, operator, aws, team):
    namespace, label = team
    name = f"queues-{label['class-test']}"
    apply_class(
        kube,
        resource_class(
            name, "Queue", label, defaults={"visibilityTimeoutSeconds": 60}, tags={"tier": "a"}
        ),
    )
    report = {f"{GROUP}/drift-policy": "report"}
    names = ["q1", "q2", "q3"]
    for queue in names:
        apply(kube, namespace, cr("Queue", queue, {"className": name}, report))
    apply(kube, namespace, cr("Queue", "own", {"visibilityTimeoutSeconds": 45}))
    urls = {
        q: wait_ready(kube, "queue", namespace, q)["status"]["queueUrl"] for q in [*names, "own"]
    }

    def attribute(queue: str, key: str) -> str:
        got = aws.sqs.get_queue_attributes(QueueUrl=urls[queue], AttributeNames=[key])
        return str(got["Attributes"][key])

    assert [attribute(q, "VisibilityTimeout") for q in names] == ["60", "60", "60"]
    # Under drift-policy report too: the platform team's edit is a requested change.
    kube.kubectl(
        "patch", "rclass", name, "--type=merge",
        "-p", '{"spec":{"defaults":{"visibilityTimeoutSeconds":90},"tags":{"tier":"b"}}}',
    )  # fmt: skip
    wait_for(
        lambda: all(attribute(q, "VisibilityTimeout") == "90" for q in names),
        timeout=90,
        what="the class's new value on its queues",
    )
    wait_for(
        lambda: all(
            aws.sqs.list_queue_tags(QueueUrl=urls[q]).get("Tags", {}).get("tier") == "b"
            for q in names
        ),
        timeout=60,
        what="the class's new tags on its queues",
    )
    # Each queue says what changed and where it came from.
    wait_for(
        lambda: all(
            any(
                f"spec.visibilityTimeoutSeconds (from ResourceClass {name})" in e["message"]
                for e in events(kube, namespace, q, "Updated")
            )
            for q in names
        ),
        what="an Updated Event naming the class on each queue",
    )
    assert attribute("own", "VisibilityTimeout") == "45"  # it names no class
    # Plan-only shows what a class would set, before anything is made.
    planned = {f"{GROUP}/plan-only": "true"}
    apply(kube, namespace, cr("Queue", "planned", {"className": name}, planned))
    plan = wait_for(
        lambda: ((get(kube, "queue", namespace, "planned") or {}).get("status") or {}).get("plan"),
        what="the plan of a queue of the class",
    )
    assert plan["action"] == "Create"
    assert plan["class"] == {
        "name": name,
        "fields": ["spec.visibilityTimeoutSeconds", "spec.tags.tier"],
    }
    got = get(kube, "queue", namespace, "q1")
    assert got["status"]["class"]["generation"] == 2
    assert not any(
        c["type"] == "Drifted" and c["status"] == "True" for c in got["status"]["conditions"]
    )


def test_a_class_that_does_not_select_the_namespace_is_not_allowed(kube, operator, team, aws):
    namespace, label = team
    name = f"elsewhere-{label['class-test']}"
    apply_class(kube, resource_class(name, "Topic", {"class-test": "nobody"}))
    apply(kube, namespace, cr("Topic", "news", {"className": name}))
    got = wait_condition(kube, "topic", namespace, "news", "Synced", "False", "ClassNotAllowed")
    assert (
        f"ResourceClass {name} does not select namespace {namespace}"
        in (condition(got, "Synced")["message"])
    )
    assert "arn" not in (got.get("status") or {})
    # Two default classes for one namespace: neither is guessed.
    for which in ("a", "b"):
        apply_class(kube, resource_class(f"{name}-{which}", "Topic", label, default=True))
    apply(kube, namespace, cr("Topic", "feed", {}))
    got = wait_condition(kube, "topic", namespace, "feed", "Synced", "False", "AmbiguousClass")
    assert f"{name}-a and {name}-b" in condition(got, "Synced")["message"]
    # One of them no longer a default: the resource is made with the other.
    kube.kubectl("patch", "rclass", f"{name}-b", "--type=merge", "-p", '{"spec":{"default":false}}')
    assert wait_ready(kube, "topic", namespace, "feed")["status"]["class"]["name"] == f"{name}-a"
    for topic in ("news", "feed"):
        kube.kubectl("delete", "topic", topic, "-n", namespace, "--wait=false")
        wait_gone(kube, "topic", namespace, topic)


def test_the_chart_policy_refuses_a_class_naming_fields_its_kind_lacks(kube, class_policies):
    name = f"typo-{uuid.uuid4().hex[:8]}"
    label = {"class-test": "nobody"}
    cases = [
        ({"visibilityTimeout": 60}, "spec.defaults.visibilityTimeout: not a field a Queue class"),
        ({"deadLetter": {"queueNam": "x"}}, "spec.defaults.deadLetter.queueNam: not a field of"),
        ({"queueName": "fixed"}, "spec.defaults.queueName: not a field a Queue class may set"),
    ]
    for defaults, said in cases:
        manifest = resource_class(name, "Queue", label, defaults=defaults)
        refused = wait_for(
            lambda m=manifest: (
                (
                    done := kube.kubectl(
                        "apply", "--dry-run=server", "-f", "-", input=m, check=False
                    )
                ).returncode
                != 0
                and done
            ),
            timeout=60,
            what="the class-defaults policy to be enforced",
        )
        assert said in refused.stderr, refused.stderr
    enforced = resource_class(name, "Queue", label, enforced=["fifoo"])
    refused = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=enforced, check=False)
    assert "spec.enforced: fifoo: not a field a Queue class may set" in refused.stderr
    good = resource_class(name, "Queue", label, defaults={"deadLetter": {"maxReceiveCount": 3}})
    assert kube.kubectl("apply", "--dry-run=server", "-f", "-", input=good).returncode == 0


def test_a_class_with_invalid_defaults_is_not_ready_and_serves_no_one(kube, operator, team, keeper):
    namespace, label = team
    name = f"typo-{label['class-test']}"
    apply_class(
        kube,
        resource_class(
            name,
            "Queue",
            label,
            default=True,
            defaults={"deadLetter": {"queueRef": {"nme": "x"}}, "delaySeconds": "soon"},
        ),
    )
    ready = condition(class_ready(kube, name), "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.defaults.deadLetter.queueRef" in ready["message"] and "nme" in ready["message"]
    assert "spec.defaults.delaySeconds: 'soon' is not of type 'integer'" in ready["message"]
    warned = wait_for(
        lambda: [e for e in class_events(kube, name) if e["reason"] == "InvalidSpec"],
        what="the class's InvalidSpec Event",
    )
    assert warned[0]["type"] == "Warning"
    apply(kube, namespace, cr("Queue", "jobs", {}))
    got = wait_condition(kube, "queue", namespace, "jobs", "Synced", "False", "InvalidSpec")
    assert f"ResourceClass {name} has invalid defaults" in condition(got, "Synced")["message"]
    assert "queueUrl" not in (got.get("status") or {})
    kube.kubectl("delete", "queue", "jobs", "-n", namespace, "--wait=false")
    wait_gone(kube, "queue", namespace, "jobs")


def test_the_production_class_example_applies_and_completes_its_database(
    kube, operator, vpc, team, keeper
):
    """examples/production/class.yaml, with this test's namespace label, subnet group and key
    in place of the reader's: the class is checked Ready, and a plan of its database shows
    what the class fills in; nothing made in the cloud, so the protected database goes at once."""
    namespace, label = team
    group = f"private-db-{label['class-test']}"
    vpc.rds.create_db_subnet_group(
        DBSubnetGroupName=group, DBSubnetGroupDescription="private", SubnetIds=vpc.subnets
    )
    klass, database = yaml.safe_load_all((REPO_ROOT / "examples/production/class.yaml").read_text())
    name = f"prod-postgres-{label['class-test']}"
    klass["metadata"]["name"] = name
    klass["spec"]["namespaceSelector"] = {"matchLabels": label}
    klass["spec"]["defaults"]["network"] = {"subnetGroupName": group}
    klass["spec"]["defaults"]["encryption"] = {"kmsKeyId": vpc.key}
    apply_class(kube, yaml.safe_dump(klass))
    assert condition(class_ready(kube, name), "Ready")["status"] == "True"

    database["spec"]["className"] = name
    database["metadata"]["annotations"] = {f"{GROUP}/plan-only": "true"}
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(database))
    planned = wait_for(
        lambda: (
            (got := get(kube, "dbi", namespace, "orders"))
            and (got.get("status") or {}).get("plan", {}).get("class")
            and got
        ),
        what="the plan of the example's database",
    )
    plan = planned["status"]["plan"]
    assert plan["action"] == "Create"
    assert plan["class"]["name"] == name
    filled = {"network", "encryption", "deletionProtection", "backupRetentionDays"}
    assert {f"spec.{f}" for f in filled} | {"spec.tags.cost-center"} <= set(plan["class"]["fields"])
    made = vpc.rds.describe_db_instances()["DBInstances"]
    groups = [(i.get("DBSubnetGroup") or {}).get("DBSubnetGroupName") for i in made]
    assert group not in groups

    # Protected by the class, but nothing was made: the deletion is not held.
    kube.kubectl("delete", "dbi", "orders", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "orders")
