"""Invalid specs are refused by the API server at apply time, with a message naming the field.

Every case goes through `kubectl apply` against a real API server with the CRDs from crds/
installed, the way a user would meet these rules; no operator needs to run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import assert_refused, try_apply

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_VERSION = "cloud.provisioner.dev/v1alpha1"

DB = "DatabaseInstance"
BUCKET = "S3Bucket"
QUEUE = "Queue"

VALID_DB: dict[str, Any] = {"engine": "postgres", "instanceClass": "db.t3.micro"}


def manifest(kind: str, name: str, spec: dict[str, Any] | None) -> str:
    body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}}
    if spec is not None:
        body["spec"] = spec
    return yaml.safe_dump(body)


def db(**fields: Any) -> dict[str, Any]:
    return {**VALID_DB, **fields}


# (kind, spec, a substring of kubectl's error); the name of every object is "bad".
CREATE_CASES = [
    pytest.param(DB, None, "spec: Required value", id="spec-missing"),
    pytest.param(DB, db(engine="oracle"), "spec.engine", id="db-engine-enum"),
    pytest.param(DB, {"instanceClass": "db.t3.micro"}, "spec.engine", id="db-engine-required"),
    pytest.param(DB, {"engine": "mysql"}, "spec.instanceClass", id="db-class-required"),
    pytest.param(DB, db(instanceClass="t3.micro"), "spec.instanceClass", id="db-class-pattern"),
    pytest.param(DB, db(engineVersion="latest"), "spec.engineVersion", id="db-version-pattern"),
    pytest.param(
        DB, db(allocatedStorageGiB=10), "spec.allocatedStorageGiB", id="db-storage-too-small"
    ),
    pytest.param(
        DB, db(allocatedStorageGiB=65537), "spec.allocatedStorageGiB", id="db-storage-too-large"
    ),
    pytest.param(DB, db(masterUsername="1admin"), "spec.masterUsername", id="db-user-pattern"),
    pytest.param(DB, db(masterUsername="a" * 17), "spec.masterUsername", id="db-user-too-long"),
    pytest.param(DB, db(databaseName="my-db"), "spec.databaseName", id="db-dbname-pattern"),
    pytest.param(DB, db(port=80), "spec.port", id="db-port-range"),
    pytest.param(DB, db(backupRetentionDays=36), "spec.backupRetentionDays", id="db-backup-range"),
    pytest.param(DB, db(deletionPolicy="Keep"), "spec.deletionPolicy", id="db-policy-enum"),
    pytest.param(DB, db(region="mars"), "spec.region", id="region-pattern"),
    pytest.param(
        DB,
        db(writeConnectionSecretToRef={"name": "Bad_Name"}),
        "spec.writeConnectionSecretToRef.name",
        id="secret-name-pattern",
    ),
    pytest.param(DB, db(tags={"env": "x" * 257}), "spec.tags", id="tag-value-too-long"),
    pytest.param(DB, db(tags={"k" * 129: "v"}), "spec.tags", id="tag-key-too-long"),
    pytest.param(
        BUCKET, {"tags": {"aws:owner": "me"}}, "spec.tags keys must not", id="tag-aws-reserved"
    ),
    pytest.param(
        QUEUE,
        {"tags": {"provisioner.dev/owner-uid": "x"}},
        "these prefixes are reserved",
        id="tag-provisioner-reserved",
    ),
    pytest.param(BUCKET, {"bucketName": "My_Bucket"}, "spec.bucketName", id="bucket-pattern"),
    pytest.param(BUCKET, {"bucketName": "ab"}, "spec.bucketName", id="bucket-too-short"),
    pytest.param(
        BUCKET,
        {"bucketName": "a..b"},
        "spec.bucketName must not contain two adjacent periods",
        id="bucket-double-dot",
    ),
    pytest.param(
        BUCKET,
        {"bucketName": "192.168.1.1"},
        "spec.bucketName must not be formatted as an IP address",
        id="bucket-ip-address",
    ),
    pytest.param(BUCKET, {"encryption": "SSE-C"}, "spec.encryption", id="bucket-encryption-enum"),
    pytest.param(
        BUCKET, {"deletionPolicy": "Snapshot"}, "spec.deletionPolicy", id="bucket-no-snapshot"
    ),
    pytest.param(
        BUCKET,
        {"lifecycle": {"expireAfterDays": 0}},
        "spec.lifecycle.expireAfterDays",
        id="bucket-expire-range",
    ),
    pytest.param(QUEUE, {"queueName": "orders!"}, "spec.queueName", id="queue-name-pattern"),
    pytest.param(
        QUEUE,
        {"queueName": "orders.fifo"},
        'spec.queueName must end with ".fifo" exactly when spec.fifo is true',
        id="queue-fifo-suffix-without-fifo",
    ),
    pytest.param(
        QUEUE,
        {"queueName": "orders", "fifo": True},
        'spec.queueName must end with ".fifo" exactly when spec.fifo is true',
        id="queue-fifo-without-suffix",
    ),
    pytest.param(
        QUEUE,
        {"visibilityTimeoutSeconds": 43201},
        "spec.visibilityTimeoutSeconds",
        id="queue-visibility-range",
    ),
    pytest.param(
        QUEUE,
        {"messageRetentionSeconds": 59},
        "spec.messageRetentionSeconds",
        id="queue-retention-range",
    ),
    pytest.param(QUEUE, {"delaySeconds": 901}, "spec.delaySeconds", id="queue-delay-range"),
    pytest.param(
        QUEUE,
        {"deadLetter": {"queueRef": {"name": "bad"}}},
        "a Queue cannot be its own dead-letter queue",
        id="queue-self-dead-letter",
    ),
    pytest.param(
        QUEUE,
        {"deadLetter": {"maxReceiveCount": 3}},
        "spec.deadLetter.queueRef",
        id="queue-dead-letter-ref-required",
    ),
    pytest.param(
        QUEUE,
        {"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 0}},
        "spec.deadLetter.maxReceiveCount",
        id="queue-receive-count-range",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "expected"), CREATE_CASES)
def test_invalid_spec_is_refused_on_create(
    kube: Any, namespace: str, kind: str, spec: dict[str, Any] | None, expected: str
) -> None:
    result = try_apply(kube, namespace, manifest(kind, "bad", spec))

    assert_refused(result, expected)
    assert "created" not in result.stdout


# (kind, the spec it is created with, the spec it is changed to, a substring of the error)
UPDATE_CASES = [
    pytest.param(
        DB,
        db(allocatedStorageGiB=50),
        db(allocatedStorageGiB=40),
        "spec.allocatedStorageGiB may grow but never shrink",
        id="db-storage-shrink",
    ),
    pytest.param(DB, db(), db(engine="mysql"), "spec.engine is immutable", id="db-engine-change"),
    pytest.param(
        DB,
        db(),
        db(masterUsername="admin"),
        "spec.masterUsername is immutable",
        id="db-user-change",
    ),
    pytest.param(
        DB,
        db(),
        db(databaseName="orders"),
        "spec.databaseName is immutable",
        id="db-dbname-added",
    ),
    pytest.param(
        DB,
        db(databaseName="orders"),
        db(),
        "spec.databaseName is immutable",
        id="db-dbname-removed",
    ),
    pytest.param(
        DB,
        db(databaseName="orders"),
        db(databaseName="billing"),
        "spec.databaseName is immutable",
        id="db-dbname-change",
    ),
    pytest.param(
        BUCKET,
        {"bucketName": "pv-e2e-one"},
        {"bucketName": "pv-e2e-two"},
        "spec.bucketName is immutable",
        id="bucket-name-change",
    ),
    pytest.param(
        BUCKET,
        {},
        {"bucketName": "pv-e2e-late"},
        "spec.bucketName is immutable",
        id="bucket-name-added",
    ),
    pytest.param(QUEUE, {}, {"fifo": True}, "spec.fifo is immutable", id="queue-fifo-change"),
    pytest.param(
        QUEUE,
        {"queueName": "orders"},
        {"queueName": "billing"},
        "spec.queueName is immutable",
        id="queue-name-change",
    ),
    pytest.param(
        QUEUE,
        {"queueName": "orders"},
        {},
        "spec.queueName is immutable",
        id="queue-name-removed",
    ),
    pytest.param(
        BUCKET,
        {"writeConnectionSecretToRef": {"name": "first"}},
        {"writeConnectionSecretToRef": {"name": "second"}},
        "spec.writeConnectionSecretToRef.name is immutable",
        id="secret-name-change",
    ),
    pytest.param(
        QUEUE,
        {},
        {"writeConnectionSecretToRef": {"name": "elsewhere"}},
        "spec.writeConnectionSecretToRef.name is immutable",
        id="secret-name-added",
    ),
]


@pytest.mark.parametrize(("kind", "before", "after", "expected"), UPDATE_CASES)
def test_forbidden_change_is_refused_on_update(
    kube: Any,
    namespace: str,
    kind: str,
    before: dict[str, Any],
    after: dict[str, Any],
    expected: str,
) -> None:
    created = try_apply(kube, namespace, manifest(kind, "subject", before))
    assert created.returncode == 0, created.stderr

    result = try_apply(kube, namespace, manifest(kind, "subject", after))

    assert_refused(result, expected)


# Changes the rules above must still let through.
ALLOWED_UPDATES = [
    pytest.param(
        DB,
        db(allocatedStorageGiB=20),
        db(allocatedStorageGiB=100, backupRetentionDays=14),
        id="db-storage-grows",
    ),
    pytest.param(
        QUEUE,
        {"queueName": "orders.fifo", "fifo": True},
        {"queueName": "orders.fifo", "fifo": True, "visibilityTimeoutSeconds": 120},
        id="queue-mutable-field",
    ),
    pytest.param(
        BUCKET,
        {},
        {"writeConnectionSecretToRef": {"name": "subject-connection"}},
        id="secret-default-name-made-explicit",
    ),
]


@pytest.mark.parametrize(("kind", "before", "after"), ALLOWED_UPDATES)
def test_allowed_change_is_accepted(
    kube: Any, namespace: str, kind: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    created = try_apply(kube, namespace, manifest(kind, "subject", before))
    assert created.returncode == 0, created.stderr

    result = try_apply(kube, namespace, manifest(kind, "subject", after))

    assert result.returncode == 0, result.stderr


def test_examples_apply_cleanly_and_get_defaults(kube: Any, namespace: str) -> None:
    result = kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES), check=False)
    assert result.returncode == 0, result.stderr

    def field(resource: str, name: str, path: str) -> str:
        got = kube.kubectl("get", resource, name, "-n", namespace, "-o", f"jsonpath={{{path}}}")
        return got.stdout.strip()

    expected_defaults = [
        ("dbi", "demo-db", ".spec.backupRetentionDays", "7"),
        ("dbi", "demo-db", ".spec.masterUsername", "app"),
        ("dbi", "demo-db", ".spec.multiAZ", "false"),
        ("dbi", "demo-db", ".spec.publiclyAccessible", "false"),
        ("dbi", "demo-db", ".spec.deletionPolicy", "Delete"),
        ("s3b", "demo-bucket", ".spec.encryption", "AES256"),
        ("s3b", "demo-bucket", ".spec.blockPublicAccess", "true"),
        ("s3b", "demo-bucket", ".spec.forceDestroy", "false"),
        ("s3b", "demo-bucket", ".spec.deletionPolicy", "Delete"),
        ("sqsq", "demo-queue", ".spec.fifo", "false"),
        ("sqsq", "demo-queue", ".spec.visibilityTimeoutSeconds", "60"),
        ("sqsq", "demo-queue", ".spec.messageRetentionSeconds", "345600"),
        ("sqsq", "demo-queue", ".spec.delaySeconds", "0"),
        ("sqsq", "demo-queue", ".spec.deletionPolicy", "Delete"),
        ("sqsq", "demo-queue", ".spec.encryption.type", "SQS"),
        ("sqsq", "demo-queue", ".spec.receiveWaitTimeSeconds", "0"),
        ("sqsq", "demo-queue", ".spec.maximumMessageSizeBytes", "262144"),
        ("snst", "demo-events", ".spec.fifo", "false"),
        ("snst", "demo-events", ".spec.deletionPolicy", "Delete"),
        ("sqsq", "demo-events-inbox", ".spec.subscribeTo[0].rawMessageDelivery", "true"),
    ]
    got = [(r, n, p, field(r, n, p)) for r, n, p, _ in expected_defaults]
    assert got == expected_defaults

    listed = kube.kubectl("get", "cloud", "-n", namespace, "-o", "name").stdout.split()
    # The category also lists the cluster's ResourceClasses, whatever the namespace.
    listed = [n for n in listed if not n.startswith("resourceclass.")]
    assert sorted(listed) == [
        "databaseinstance.cloud.provisioner.dev/demo-db",
        "queue.cloud.provisioner.dev/demo-events-inbox",
        "queue.cloud.provisioner.dev/demo-orders",
        "queue.cloud.provisioner.dev/demo-orders-dlq",
        "queue.cloud.provisioner.dev/demo-queue",
        "s3bucket.cloud.provisioner.dev/demo-bucket",
        "topic.cloud.provisioner.dev/demo-events",
    ]


def test_snapshot_is_the_database_default_deletion_policy(kube: Any, namespace: str) -> None:
    result = try_apply(kube, namespace, manifest(DB, "snap", db()))
    assert result.returncode == 0, result.stderr

    got = kube.kubectl(
        "get", "dbi", "snap", "-n", namespace, "-o", "jsonpath={.spec.deletionPolicy}"
    )
    assert got.stdout.strip() == "Snapshot"


PRODUCTION = EXAMPLES / "production" / "database.yaml"


def test_the_production_database_example_applies(kube: Any, namespace: str) -> None:
    """examples/production/ is apart from examples/ (which `make demo` applies and shows Ready):
    its subnet group, security group and key are the reader's to fill in."""
    result = kube.kubectl("apply", "-n", namespace, "-f", str(PRODUCTION), check=False)
    try:
        assert result.returncode == 0, result.stderr
        shown = kube.kubectl("get", "dbi", "orders-prod", "-n", namespace, "-o", "json")
        got = json.loads(shown.stdout)["spec"]
        assert got["encryption"] == {"enabled": True, "kmsKeyId": "alias/rds-prod"}
        assert got["masterPassword"] == {"managedBy": "SecretsManager"}
        assert got["deletionProtection"] is True
        assert got["network"]["subnetGroupName"] == "private-db"
    finally:
        # Protected from deletion: turned off, as the example's comment says, so that the
        # namespace goes.
        kube.kubectl(
            "patch",
            "dbi",
            "orders-prod",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"deletionProtection":false}}',
            check=False,
        )
