"""A hostile tenant, holding only the standard `edit` role in its own namespace, against the
operator: it cannot freeze the operator for others, take over untagged cloud resources, learn
another team's uids, or keep a namespace from going away.

The tenant is a ServiceAccount bound to `edit`, impersonated with `kubectl --as`; the chart's
aggregated roles give `edit` the kinds (rendered with helm, as the chart installs them).
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from provisioner_dev.binaries import cached_helm, ensure_helm
from tests.conftest import Cluster, fresh_namespace
from tests.helpers import (
    condition,
    events,
    get,
    resource_class,
    secret_data,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300 if cached_helm() else 1200)]

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "provisioner"
GROUP = "cloud.provisioner.dev"
ADOPTABLE_BY = "provisioner.dev/adoptable-by"
Tenant = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def edit_covers_the_kinds(cluster: Cluster) -> Iterator[None]:
    """The chart's aggregated roles, so that `edit` holds the kinds (needs the controller
    manager, which aggregates them)."""
    if not cluster.has_controller_manager:
        pytest.skip("no kube-controller-manager (envtest's binaries): no role aggregation")
    release = f"ti{uuid.uuid4().hex[:6]}"
    rendered = subprocess.run(
        [
            *(str(ensure_helm()), "template", release, str(CHART), "--namespace", "default"),
            *("--show-only", "templates/aggregated-roles.yaml"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    cluster.kubectl("apply", "-f", "-", input=rendered)
    try:
        yield
    finally:
        for obj in (d for d in yaml.safe_load_all(rendered) if d):
            cluster.kubectl(
                "delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False
            )


def tenant(kube: Cluster, namespace: str) -> Tenant:
    """kubectl as `system:serviceaccount:<namespace>:tenant`, bound to `edit` there."""
    kube.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
    kube.kubectl(
        "create", "rolebinding", "tenant", "--clusterrole=edit",
        f"--serviceaccount={namespace}:tenant", "-n", namespace,
    )  # fmt: skip
    who = f"--as=system:serviceaccount:{namespace}:tenant"

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return kube.kubectl(*args, who, "-n", namespace, input=input, check=False)

    wait_for(
        lambda: run("auth", "can-i", "create", f"queues.{GROUP}").stdout.strip() == "yes",
        what="the edit role to cover the kinds",
    )
    return run


def as_tenant(run: Tenant, *args: str, input: str | None = None) -> str:
    result = run(*args, input=input)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def resource(kind: str, name: str, spec: dict, annotations: dict | None = None) -> str:
    meta: dict = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    body = {"apiVersion": f"{GROUP}/v1beta1", "kind": kind, "metadata": meta, "spec": spec}
    return json.dumps(body)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    yield from fresh_namespace(cluster, "t")


def test_a_template_planted_in_a_secret_never_freezes_the_operator(
    kube, operator, namespace, other_namespace, edit_covers_the_kinds
):
    """A pattern built from a Secret's data once backtracked for minutes on the operator's
    event loop: the tenant plants the template that did it, asks for a pass, and another
    team's Queue is still Ready at once, the tenant's Secret restored with its password."""
    run = tenant(kube, namespace)
    keys = {"DATABASE_URL": "{{ .uri }}", "PGHOST": "{{ .host }}"}
    spec = {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "deletionPolicy": "Delete",
        "connectionSecret": {"name": "app-env", "keys": keys},
    }
    as_tenant(run, "apply", "-f", "-", input=resource("DatabaseInstance", "app", spec))
    wait_ready(kube, "dbi", namespace, "app")
    password = urlsplit(secret_data(kube, namespace, "app-env")["DATABASE_URL"]).password

    planted = {"X": "{{ .host }}" * 10 + "{{ .password }}"}
    patch = {
        "metadata": {"annotations": {f"{GROUP}/template": json.dumps(planted)}},
        "data": {"X": base64.b64encode(b"a" * 60).decode()},
    }
    as_tenant(run, "patch", "secret", "app-env", "--type=merge", "-p", json.dumps(patch))
    as_tenant(run, "annotate", "dbi", "app", f"{GROUP}/reconcile-requested-at=planted")

    kube.kubectl("apply", "-n", other_namespace, "-f", "-", input=resource("Queue", "innocent", {}))
    wait_ready(kube, "queue", other_namespace, "innocent", timeout=90)
    restored = wait_for(
        lambda: (d := secret_data(kube, namespace, "app-env")) and "X" not in d and d,
        timeout=60,
        what="the tenant's Secret to be restored",
    )
    assert urlsplit(restored["DATABASE_URL"]).password == password
    assert not events(kube, namespace, "app", "PasswordChanged")


def test_the_adopt_annotation_alone_never_takes_over_an_untagged_resource(
    kube, operator, aws, namespace, edit_covers_the_kinds
):
    """Another team's untagged bucket (holding data) and database: the tenant names them,
    asks to adopt them with its own spec, then deletes its CRs. Nothing is touched."""
    run = tenant(kube, namespace)
    bucket, ident = f"data-{namespace}", f"legacy-{namespace}"
    aws.s3.create_bucket(Bucket=bucket)
    aws.s3.put_object(Bucket=bucket, Key="ledger.csv", Body=b"other team's data")
    aws.rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        MasterUsername="owner",
        MasterUserPassword="OwnersOwnPassword1",
        AllocatedStorage=20,
    )
    adopt = {f"{GROUP}/adopt": "true"}
    grab_bucket = resource("S3Bucket", "grab", {"bucketName": bucket, "forceDestroy": True}, adopt)
    grab_db = resource(
        "DatabaseInstance",
        "grabdb",
        {
            "instanceIdentifier": ident,
            "engine": "postgres",
            "instanceClass": "db.t3.micro",
            "publiclyAccessible": True,
            "deletionPolicy": "Delete",
        },
        adopt,
    )
    as_tenant(run, "apply", "-f", "-", input=grab_bucket)
    as_tenant(run, "apply", "-f", "-", input=grab_db)
    for kind, name in (("s3bucket", "grab"), ("dbi", "grabdb")):
        cr = wait_condition(kube, kind, namespace, name, "Synced", "False", "NameConflict")
        assert f"{ADOPTABLE_BY}={namespace}" in condition(cr, "Synced")["message"]

    as_tenant(run, "delete", "s3bucket", "grab", "--wait=false")
    as_tenant(run, "delete", "dbi", "grabdb", "--wait=false")
    wait_gone(kube, "s3bucket", namespace, "grab")
    wait_gone(kube, "dbi", namespace, "grabdb")

    body = aws.s3.get_object(Bucket=bucket, Key="ledger.csv")["Body"].read()
    assert body == b"other team's data"
    with pytest.raises(aws.s3.exceptions.ClientError):
        aws.s3.get_bucket_tagging(Bucket=bucket)  # still untagged: never ours
    instance = aws.rds.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
    assert instance["DBInstanceStatus"] == "available"
    assert not instance.get("PubliclyAccessible")
    assert not [r for r in kube.cloud_requests(ident) if "ModifyDBInstance" in r]


def test_a_name_conflict_never_shows_the_other_owners_uid(
    kube, operator, namespace, other_namespace, edit_covers_the_kinds
):
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    kube.kubectl(
        "apply", "-n", other_namespace, "-f", "-",
        input=resource("Queue", "first", {"queueName": shared}),
    )  # fmt: skip
    uid = wait_ready(kube, "queue", other_namespace, "first")["metadata"]["uid"]

    run = tenant(kube, namespace)
    plan = {f"{GROUP}/plan-only": "true"}
    as_tenant(run, "apply", "-f", "-", input=resource("Queue", "second", {"queueName": shared}))
    as_tenant(
        run, "apply", "-f", "-", input=resource("Queue", "planned", {"queueName": shared}, plan)
    )
    cr = wait_condition(kube, "queue", namespace, "second", "Synced", "False", "NameConflict")
    assert "owned by another resource" in condition(cr, "Synced")["message"]
    planned = wait_for(
        lambda: (get(kube, "queue", namespace, "planned") or {}).get("status", {}).get("plan"),
        what="the plan",
    )
    assert planned["action"] == "Blocked"
    seen = json.dumps(
        [
            as_tenant(run, "get", "queues", "-o", "json"),
            as_tenant(run, "get", "events", "-o", "json"),
        ]
    )
    assert uid not in seen


def test_deleting_a_namespace_deletes_its_paused_resources(kube, operator, aws):
    """Pause holds a CR's deletion, but not its namespace's: the namespace goes, and the
    cloud resource with it (by its deletionPolicy), instead of Terminating forever."""
    if not kube.has_controller_manager:
        pytest.skip("no kube-controller-manager (envtest's binaries): no namespace deletion")
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl("apply", "-n", name, "-f", "-", input=resource("Queue", "held", {}))
    url = wait_ready(kube, "queue", name, "held")["status"]["queueUrl"]
    kube.kubectl("annotate", "queue", "held", "-n", name, f"{GROUP}/paused=true")
    wait_condition(kube, "queue", name, "held", "Synced", "False", "Paused")

    kube.kubectl("delete", "namespace", name, "--wait=false")
    wait_for(
        lambda: kube.kubectl("get", "namespace", name, check=False).returncode != 0,
        timeout=120,
        what=f"namespace {name} to be gone",
    )
    with pytest.raises(aws.sqs.exceptions.QueueDoesNotExist):
        aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])


def test_a_tenant_can_neither_write_a_class_nor_use_one_that_is_not_for_it(
    kube, operator, namespace, other_namespace, edit_covers_the_kinds
):
    run = tenant(kube, namespace)
    name = f"team-{uuid.uuid4().hex[:8]}"
    body = resource_class(
        name,
        "Queue",
        {"kubernetes.io/metadata.name": other_namespace},
        default=True,
        defaults={"visibilityTimeoutSeconds": 120},
    )
    refused = run("create", "-f", "-", input=body)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    # One the platform made for another namespace: neither editable nor usable here.
    kube.kubectl("create", "-f", "-", input=body)
    try:
        patched = run(
            "patch", "rclass", name, "--type=merge",
            "-p", '{"spec":{"namespaceSelector":{"matchLabels":{}}}}',
        )  # fmt: skip
        assert patched.returncode != 0 and "forbidden" in patched.stderr.lower()
        deleted = run("delete", "rclass", name, "--wait=false")
        assert deleted.returncode != 0 and "forbidden" in deleted.stderr.lower()
        as_tenant(run, "apply", "-f", "-", input=resource("Queue", "q", {"className": name}))
        got = wait_condition(kube, "queue", namespace, "q", "Synced", "False", "ClassNotAllowed")
        assert "queueUrl" not in (got.get("status") or {})
        # Its default class does not reach here either: a bare queue gets the schema default.
        as_tenant(run, "apply", "-f", "-", input=resource("Queue", "bare", {}))
        bare = wait_ready(kube, "queue", namespace, "bare")
        assert "class" not in bare["status"]
        for queue in ("q", "bare"):
            as_tenant(run, "delete", "queue", queue, "--wait=false")
            wait_gone(kube, "queue", namespace, queue)
    finally:
        kube.kubectl("delete", "rclass", name, "--wait=false", check=False)
