"""DatabaseInstance: create, connect details, change, deletion policies, password hygiene."""

from __future__ import annotations

import json

import pytest

from tests.helpers import (
    apply,
    events,
    merge_patch,
    secret_data,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

DB_KEYS = {"host", "port", "username", "password", "database", "engine", "uri", "arn"}


def db_manifest(name: str, extra: str = "", storage: int = 20) -> str:
    return (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: DatabaseInstance\n"
        f"metadata:\n  name: {name}\n"
        "spec:\n  engine: postgres\n  instanceClass: db.t3.micro\n"
        f"  allocatedStorageGiB: {storage}\n{extra}"
    )


def describe(aws, identifier: str) -> dict | None:
    try:
        return aws.rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]
    except aws.rds.exceptions.DBInstanceNotFoundFault:
        return None


def snapshots(aws, identifier: str) -> list[str]:
    found = aws.rds.describe_db_snapshots(DBInstanceIdentifier=identifier)["DBSnapshots"]
    return [s["DBSnapshotIdentifier"] for s in found]


def test_database_lifecycle(kube, operator, aws, namespace):
    apply(
        kube,
        namespace,
        db_manifest(
            "orders", "  databaseName: orders\n  deletionPolicy: Delete\n  tags: {team: shop}\n"
        ),
    )
    cr = wait_ready(kube, "databaseinstance", namespace, "orders")
    identifier = cr["status"]["externalName"]

    data = secret_data(kube, namespace, "orders-connection")
    assert data is not None and set(data) == DB_KEYS
    password = data["password"]
    assert len(password) >= 24 and password.isalnum()
    assert (
        data["username"] == "app" and data["database"] == "orders" and data["engine"] == "postgres"
    )
    assert data["uri"] == f"postgresql://app:{password}@{data['host']}:{data['port']}/orders"
    assert cr["status"]["endpoint"] == f"{data['host']}:{data['port']}"

    instance = describe(aws, identifier)
    assert instance["DBInstanceClass"] == "db.t3.micro"
    assert instance["AllocatedStorage"] == 20 and instance["BackupRetentionPeriod"] == 7
    assert instance["MasterUsername"] == "app" and instance["DBName"] == "orders"
    assert instance["DBInstanceArn"] == data["arn"] == cr["status"]["arn"]
    tags = {t["Key"]: t["Value"] for t in instance["TagList"]}
    assert tags["team"] == "shop"
    assert tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert tags["provisioner.dev/cluster"] == "test"

    merge_patch(
        kube,
        "dbi",
        namespace,
        "orders",
        '{"spec":{"instanceClass":"db.t3.small","storage":{"sizeGiB":50},"backupRetentionDays":3}}',
    )
    wait_ready(kube, "dbi", namespace, "orders", generation=2)
    instance = describe(aws, identifier)
    assert instance["DBInstanceClass"] == "db.t3.small"
    assert instance["AllocatedStorage"] == 50 and instance["BackupRetentionPeriod"] == 3
    assert secret_data(kube, namespace, "orders-connection")["password"] == password

    # The password is nowhere but the Secret: not in the CR, its Events, or the log.
    cr_text = kube.kubectl("get", "dbi", "orders", "-n", namespace, "-o", "json").stdout
    assert password not in cr_text
    assert password not in json.dumps(events(kube, namespace, "orders"))
    assert password not in operator.log.read_text(errors="replace")

    kube.kubectl("delete", "dbi", "orders", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "orders")
    assert describe(aws, identifier) is None
    assert snapshots(aws, identifier) == []
    assert secret_data(kube, namespace, "orders-connection") is None


def test_default_policy_takes_a_final_snapshot(kube, operator, aws, namespace):
    apply(kube, namespace, db_manifest("ledger"))
    cr = wait_ready(kube, "dbi", namespace, "ledger")
    identifier = cr["status"]["externalName"]
    assert cr["spec"]["deletionPolicy"] == "Snapshot"
    kube.kubectl("delete", "dbi", "ledger", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "ledger")
    assert describe(aws, identifier) is None
    taken = snapshots(aws, identifier)
    assert len(taken) == 1 and taken[0].startswith(f"{identifier}-final-")
    assert taken[0].rsplit("-", 1)[1].isdigit()


def test_retain_leaves_the_instance(kube, operator, aws, namespace):
    apply(kube, namespace, db_manifest("archive", "  deletionPolicy: Retain\n"))
    cr = wait_ready(kube, "dbi", namespace, "archive")
    identifier = cr["status"]["externalName"]
    kube.kubectl("delete", "dbi", "archive", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "archive")
    instance = describe(aws, identifier)
    assert instance is not None and instance["DBInstanceStatus"] == "available"
    tags = {t["Key"]: t["Value"] for t in instance["TagList"]}
    assert tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert secret_data(kube, namespace, "archive-connection") is None


def test_deleted_secret_gets_a_new_password_the_cloud_accepts(kube, operator, aws, namespace):
    apply(kube, namespace, db_manifest("billing", "  deletionPolicy: Delete\n"))
    wait_ready(kube, "dbi", namespace, "billing")
    old = secret_data(kube, namespace, "billing-connection")["password"]
    kube.kubectl("delete", "secret", "billing-connection", "-n", namespace)
    new = wait_for(
        lambda: (d := secret_data(kube, namespace, "billing-connection")) and d["password"],
        timeout=30,
        what="the Secret to be recreated",
    )
    assert new != old
    modify = [r for r in kube.cloud_requests("ModifyDBInstance") if new in r]
    assert modify, "the new password was set in the cloud before it was written to the Secret"


def test_shrinking_storage_and_changing_engine_are_refused(kube, operator, namespace):
    apply(kube, namespace, db_manifest("fixed", storage=40))
    # kubectl's `dbi` is v1beta1 (the preferred version); both versions keep the rule.
    for resource, patch, said in [
        ("dbi", '{"spec":{"storage":{"sizeGiB":30}}}', "spec.storage.sizeGiB"),
        (
            "databaseinstances.v1alpha1.cloud.provisioner.dev",
            '{"spec":{"allocatedStorageGiB":30}}',
            "spec.allocatedStorageGiB",
        ),
    ]:
        shrink = kube.kubectl(
            "patch", resource, "fixed", "-n", namespace, "--type=merge", "-p", patch, check=False
        )
        assert shrink.returncode != 0
        assert f"{said} may grow but never shrink" in shrink.stderr
    engine = kube.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=db_manifest("fixed", storage=40).replace("postgres", "mysql"),
        check=False,
    )
    assert engine.returncode != 0 and "spec.engine is immutable" in engine.stderr
