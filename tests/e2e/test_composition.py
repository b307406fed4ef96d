"""docs/composition.md, run: kro composes an App from a DatabaseInstance, a Queue and an S3Bucket.

The ResourceGraphDefinition, the App and the ClusterRole are read from the page itself, so the
page stays true. kro's controller (built once per machine from its pinned Go module, hack/kro)
runs as a ServiceAccount holding exactly its chart's own rules and the page's ClusterRole,
against a stack of the test's own: its CRDs and the App kind never reach the shared cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner_dev.binaries import REPO_ROOT, BuildError
from provisioner_dev.kro import (
    KRO_STATIC_RULES,
    KRO_VERSION,
    KroController,
    cached_kro,
    ensure_kro,
    kro_crds,
)
from tests.e2e.conftest import OwnStack
from tests.helpers import (
    apply,
    condition,
    get,
    is_true,
    merge_patch,
    owned_cloud_resources,
    wait_for,
    wait_gone,
    wait_ready,
)

# A cold build of kro takes minutes on 2 cores; once cached, the test needs well under 300 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300 if cached_kro() else 900)]

DOC = REPO_ROOT / "docs" / "composition.md"
# The App's resources by their id in the graph: kind and the suffix of their name.
CHILDREN = {
    "database": ("databaseinstance", "db"),
    "queue": ("queue", "jobs"),
    "bucket": ("s3bucket", "files"),
}


def doc_objects() -> dict[str, dict[str, Any]]:
    """The page's YAML blocks by kind: ResourceGraphDefinition, App, ClusterRole."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.MULTILINE | re.DOTALL)
    found = {doc["kind"]: doc for doc in map(yaml.safe_load, blocks)}
    assert set(found) == {"ResourceGraphDefinition", "App", "ClusterRole"}, set(found)
    return found


@pytest.fixture
def kro_binary() -> Path:
    """Built before the stack starts, so that a machine that cannot build it skips at once."""
    try:
        return ensure_kro()
    except BuildError as exc:
        pytest.skip(f"kro {KRO_VERSION} cannot be built from the Go module proxy here: {exc}")


@pytest.fixture
def kro(kro_binary: Path, own_stack: OwnStack) -> Iterator[KroController]:
    kube = own_stack.kube
    for crd in kro_crds():
        kube.kubectl("apply", "--server-side", "-f", str(crd))
        kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crd))
    rules = KRO_STATIC_RULES + doc_objects()["ClusterRole"]["rules"]
    kubeconfig = kube.stack.service_account_kubeconfig("kro", rules)
    controller = KroController(binary=kro_binary, kubeconfig=kubeconfig, log=kube.dir / "kro.log")
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()
    denied = [
        line
        for line in controller.log.read_text(errors="replace").splitlines()
        if "is forbidden" in line
    ]
    assert not denied, f"the page's ClusterRole does not let kro do its work: {denied[:3]}"


def app_status_complete(app: dict[str, Any] | None) -> dict[str, Any] | None:
    status = (app or {}).get("status") or {}
    wanted = ("databaseEndpoint", "databaseSecret", "queueUrl", "bucketName")
    if ready_now(app) and all(status.get(key) for key in wanted):
        return app
    return None


def ready_now(obj: dict[str, Any] | None) -> bool:
    """Ready, for the generation the object has now."""
    ready = condition(obj, "Ready")
    return bool(
        obj
        and ready
        and ready["status"] == "True"
        and ready.get("observedGeneration") == obj["metadata"]["generation"]
    )


def test_an_app_composed_by_kro_is_made_ready_and_leaves_nothing(kro, own_stack):
    kube, aws, namespace = own_stack.kube, own_stack.aws, own_stack.namespace
    objects = doc_objects()
    rgd = objects["ResourceGraphDefinition"]["metadata"]["name"]
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(objects["ResourceGraphDefinition"]))
    wait_for(
        lambda: is_true(get_rgd(kube, rgd), "Ready"),
        what=f"ResourceGraphDefinition {rgd} Ready (kro's log: {kro.log})",
    )

    name = objects["App"]["metadata"]["name"]
    apply(kube, namespace, yaml.safe_dump(objects["App"]))
    # No operator yet: kro makes the three resources, but none becomes Ready, nor the App.
    waiting = wait_for(
        lambda: app_waiting(kube, namespace, name),
        what=f"App {name}'s resources made and its Ready condition written",
    )
    assert condition(waiting, "Ready")["status"] != "True", waiting["status"]

    own_stack.start_operator()
    app = wait_for(
        lambda: app_status_complete(get(kube, "app", namespace, name)),
        timeout=120,
        what=f"App {name} Ready with its resources' status (kro's log: {kro.log})",
    )
    children = {
        key: get(kube, kind, namespace, f"{name}-{suffix}")
        for key, (kind, suffix) in CHILDREN.items()
    }
    for key, child in children.items():
        assert ready_now(child), f"the App is Ready, its {key} is not: {child}"
    check_cloud(aws, app["status"], children, name)
    change_the_instance_class(kube, aws, namespace, name, children["database"])

    kube.kubectl("delete", "app", name, "-n", namespace, "--wait=false")
    wait_gone(kube, "app", namespace, name, timeout=120)
    # kro lets the App go only once its resources are gone, and each of those only once the
    # operator has deleted its cloud resource.
    for key, (kind, _) in CHILDREN.items():
        child = children[key]
        assert get(kube, kind, namespace, child["metadata"]["name"]) is None, f"{key} is left"
        uid = child["metadata"]["uid"]
        assert owned_cloud_resources(aws, uid) == [], f"the {key} left {uid} in the cloud"
    # deletionPolicy: Delete (the App's spec), so not even a final snapshot stays.
    identifier = children["database"]["status"]["externalName"]
    assert aws.rds.describe_db_snapshots(DBInstanceIdentifier=identifier)["DBSnapshots"] == []


def app_waiting(kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The App once kro has made all its resources and written its Ready condition."""
    if any(
        get(kube, kind, namespace, f"{name}-{suffix}") is None for kind, suffix in CHILDREN.values()
    ):
        return None
    app = get(kube, "app", namespace, name)
    return app if condition(app, "Ready") else None


def change_the_instance_class(
    kube, aws, namespace: str, app: str, database: dict[str, Any]
) -> None:
    """A change of the App reaches its DatabaseInstance's spec, and RDS."""
    merge_patch(
        kube, "app", namespace, app, '{"spec":{"database":{"instanceClass":"db.t3.small"}}}'
    )
    name = database["metadata"]["name"]
    changed = wait_ready(kube, "databaseinstance", namespace, name, generation=2)
    assert changed["spec"]["instanceClass"] == "db.t3.small"
    identifier = database["status"]["externalName"]
    instance = aws.rds.describe_db_instances(DBInstanceIdentifier=identifier)
    assert instance["DBInstances"][0]["DBInstanceClass"] == "db.t3.small"
    wait_for(
        lambda: app_status_complete(get(kube, "app", namespace, app)),
        what=f"App {app} Ready for its new generation",
    )


def get_rgd(kube, name: str) -> dict[str, Any] | None:
    result = kube.kubectl("get", "resourcegraphdefinition", name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def check_cloud(aws, status: dict[str, Any], children: dict[str, Any], app: str) -> None:
    """The App's status is what the cloud holds, and each resource carries the App's tag."""
    db = children["database"]
    identifier = db["status"]["externalName"]
    instance = aws.rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]
    address = instance["Endpoint"]
    assert status["databaseEndpoint"] == f"{address['Address']}:{address['Port']}"
    assert status["databaseSecret"] == db["status"]["connectionSecret"]
    assert instance["Engine"] == "postgres" and instance["DBInstanceClass"] == "db.t3.micro"
    assert {"Key": "app", "Value": app} in instance["TagList"]

    queue = children["queue"]
    assert status["queueUrl"] == queue["status"]["queueUrl"]
    found = aws.sqs.get_queue_url(QueueName=queue["status"]["externalName"])
    assert status["queueUrl"] == found["QueueUrl"]
    attributes = aws.sqs.get_queue_attributes(QueueUrl=status["queueUrl"], AttributeNames=["All"])
    assert attributes["Attributes"]["FifoQueue"] == "true"
    assert aws.sqs.list_queue_tags(QueueUrl=status["queueUrl"])["Tags"]["app"] == app

    bucket = children["bucket"]["status"]["externalName"]
    assert status["bucketName"] == bucket
    tags = aws.s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    assert {"Key": "app", "Value": app} in tags
