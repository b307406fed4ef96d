"""DatabaseInstance recovery and replicas through the API server against moto: restore from the
final snapshot of a deleted resource, point-in-time from a live one, a refused foreign snapshot,
read replicas and their promotion, the rules the API server enforces, and a crash mid-restore."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.e2e.test_awslike import RDS_SCALE, aws_like, external_name, ready  # noqa: F401
from tests.e2e.test_database import describe
from tests.e2e.test_database_password import client
from tests.e2e.test_day2 import last_password_sent
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    get,
    merge_patch,
    owned_cloud_resources,
    secret_data,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PLAN_ONLY = "cloud.provisioner.dev/plan-only"


def db(name: str, extra: str = "", annotations: str = "") -> str:
    meta = f"  annotations:\n{annotations}" if annotations else ""
    return (
        "apiVersion: cloud.provisioner.dev/v1beta1\nkind: DatabaseInstance\n"
        f"metadata:\n  name: {name}\n{meta}"
        "spec:\n  engine: postgres\n  instanceClass: db.t3.micro\n"
        f"  deletionPolicy: Delete\n{extra}"
    )


def delete(kube, namespace: str, name: str) -> None:
    kube.kubectl("delete", "dbi", name, "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, name, timeout=120)


def test_final_snapshot_of_a_deleted_database_restores_it_with_a_new_password(
    kube, operator, aws, namespace
):
    apply(
        kube, namespace, db("orders").replace("deletionPolicy: Delete", "deletionPolicy: Snapshot")
    )
    cr = wait_ready(kube, "dbi", namespace, "orders")
    old = secret_data(kube, namespace, "orders-connection")["password"]
    delete(kube, namespace, "orders")
    taken = aws.rds.describe_db_snapshots(DBInstanceIdentifier=cr["status"]["externalName"])
    [snapshot] = [s["DBSnapshotIdentifier"] for s in taken["DBSnapshots"]]

    apply(kube, namespace, db("orders-back", "  restoreFrom: {finalSnapshotOf: {name: orders}}\n"))
    back = wait_ready(kube, "dbi", namespace, "orders-back")
    assert back["status"]["restoredFrom"] == {
        "finalSnapshotOf": "orders",
        "snapshotIdentifier": snapshot,
    }
    identifier = back["status"]["externalName"]
    assert describe(aws, identifier)["TagList"]
    # A new password, set in the cloud, is the one the Secret holds; the snapshot's is gone.
    password = secret_data(kube, namespace, "orders-back-connection")["password"]
    assert password != old
    assert last_password_sent(kube, identifier) == password
    # The same snapshot named by its identifier: this namespace's, so it is restored too.
    apply(
        kube, namespace, db("orders-copy", f"  restoreFrom: {{snapshotIdentifier: {snapshot}}}\n")
    )
    copy = wait_ready(kube, "dbi", namespace, "orders-copy")
    assert copy["status"]["restoredFrom"] == {"snapshotIdentifier": snapshot}
    delete(kube, namespace, "orders-back")
    delete(kube, namespace, "orders-copy")
    assert describe(aws, identifier) is None


def test_a_snapshot_that_is_not_the_namespaces_is_refused_naming_it(kube, operator, aws, namespace):
    ident = f"foreign-{uuid.uuid4().hex[:8]}"
    aws.rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="admin",
        MasterUserPassword="another-teams-password",
    )
    # Tagged as another namespace's, by the operator of this very cluster.
    tags = [
        {"Key": "provisioner.dev/namespace", "Value": "someone-else"},
        {"Key": "provisioner.dev/name", "Value": "their-db"},
        {"Key": "provisioner.dev/cluster", "Value": "test"},
    ]
    snapshot = f"{ident}-snap"
    aws.rds.create_db_snapshot(DBInstanceIdentifier=ident, DBSnapshotIdentifier=snapshot, Tags=tags)
    apply(kube, namespace, db("thief", f"  restoreFrom: {{snapshotIdentifier: {snapshot}}}\n"))
    cr = wait_condition(kube, "dbi", namespace, "thief", "Synced", "False", "InvalidSpec")
    synced = condition(cr, "Synced")
    assert f"snapshot {snapshot} is not this namespace's" in synced["message"]
    assert owned_cloud_resources(aws, cr["metadata"]["uid"]) == []
    delete(kube, namespace, "thief")


def test_point_in_time_clone_of_a_live_database_outlives_its_source(kube, operator, aws, namespace):
    clone = "  restoreFrom: {pointInTime: {sourceRef: {name: live}, latest: true}}\n"
    apply(kube, namespace, db("preview", clone))
    waiting = wait_condition(
        kube, "dbi", namespace, "preview", "Ready", "False", "WaitingForDependency"
    )
    assert "live" in condition(waiting, "Ready")["message"]

    apply(kube, namespace, db("live"))
    live = wait_ready(kube, "dbi", namespace, "live")
    preview = wait_ready(kube, "dbi", namespace, "preview", timeout=120)
    assert preview["status"]["restoredFrom"] == {
        "pointInTimeOf": "live",
        "sourceInstanceIdentifier": live["status"]["externalName"],
        "time": "latest",
    }
    source_password = secret_data(kube, namespace, "live-connection")["password"]
    password = secret_data(kube, namespace, "preview-connection")["password"]
    assert password != source_password
    assert last_password_sent(kube, preview["status"]["externalName"]) == password

    # Needed only to create it: the clone stays Ready without its source.
    delete(kube, namespace, "live")
    kube.kubectl(
        "annotate",
        "dbi",
        "preview",
        "-n",
        namespace,
        "cloud.provisioner.dev/reconcile-requested-at=1",
    )
    wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "preview"))
            and o["status"].get("lastReconcileRequest") == "1"
        ),
        timeout=60,
        what="the reconcile request to be handled",
    )
    assert condition(get(kube, "dbi", namespace, "preview"), "Ready")["status"] == "True"
    delete(kube, namespace, "preview")


def test_plan_only_shows_a_restore_and_writes_nothing(kube, operator, aws, namespace):
    annotations = f'    {PLAN_ONLY}: "true"\n'
    spec = "  restoreFrom: {snapshotIdentifier: some-snapshot}\n"
    apply(kube, namespace, db("planned", spec, annotations))
    cr = wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "planned"))
            and (o.get("status") or {}).get("plan")
            and o
        ),
        timeout=60,
        what="the plan",
    )
    plan = cr["status"]["plan"]
    assert plan["action"] == "Create"
    assert "restored from snapshot some-snapshot" in plan["reason"]
    assert owned_cloud_resources(aws, cr["metadata"]["uid"]) == []
    delete(kube, namespace, "planned")


def test_replica_has_the_sources_credentials_holds_its_source_and_is_promoted(
    kube, operator, aws, namespace
):
    apply(kube, namespace, db("reader", "  replicaOf: {name: primary}\n"))
    waiting = wait_condition(
        kube, "dbi", namespace, "reader", "Ready", "False", "WaitingForDependency"
    )
    assert "primary" in condition(waiting, "Ready")["message"]
    apply(kube, namespace, db("primary"))
    primary = wait_ready(kube, "dbi", namespace, "primary")
    reader = wait_ready(kube, "dbi", namespace, "reader", timeout=120)
    source_id = primary["status"]["externalName"]
    assert reader["status"]["replicaOf"] == source_id
    replica = describe(aws, reader["status"]["externalName"])
    assert replica["ReadReplicaSourceDBInstanceIdentifier"] == source_id
    source_secret = secret_data(kube, namespace, "primary-connection")
    secret = secret_data(kube, namespace, "reader-connection")
    assert secret["password"] == source_secret["password"]
    assert secret["host"] == replica["Endpoint"]["Address"]
    assert reader["status"]["endpoint"] == f"{secret['host']}:{secret['port']}"

    # Deleting the source waits for its replica, naming it.
    replica_id = reader["status"]["externalName"]
    kube.kubectl("delete", "dbi", "primary", "-n", namespace, "--wait=false")
    held = wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "primary"))
            and replica_id in (condition(o, "Ready") or {}).get("message", "")
            and o
        ),
        timeout=60,
        what="the source's deletion to wait for its replica",
    )
    assert condition(held, "Ready")["reason"] == "Deleting"
    assert describe(aws, source_id) is not None

    # Removing replicaOf promotes it: plan-only shows that first.
    kube.kubectl("annotate", "dbi", "reader", "-n", namespace, f"{PLAN_ONLY}=true")
    merge_patch(kube, "dbi", namespace, "reader", '{"spec":{"replicaOf":null}}')
    planned = wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "reader"))
            and (o["status"].get("plan") or {}).get("generation") == 2
            and o["status"]["plan"]
        ),
        timeout=60,
        what="the promotion's plan",
    )
    assert planned["action"] == "Update"
    assert [c["field"] for c in planned["changes"]] == ["spec.replicaOf"]
    still = describe(aws, reader["status"]["externalName"])
    assert "provisioner.dev/replica-of" in {t["Key"] for t in still["TagList"]}
    kube.kubectl("annotate", "dbi", "reader", "-n", namespace, f"{PLAN_ONLY}-")
    promoted = wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "reader"))
            and o["status"].get("observedGeneration") == 2
            and "replicaOf" not in o["status"]
            and o
        ),
        timeout=120,
        what="the promotion",
    )
    assert condition(promoted, "Ready")["status"] == "True"
    tags = {t["Key"] for t in describe(aws, reader["status"]["externalName"])["TagList"]}
    assert "provisioner.dev/replica-of" not in tags
    # The source's deletion goes on; the promoted instance keeps its password.
    wait_gone(kube, "dbi", namespace, "primary", timeout=120)
    assert secret_data(kube, namespace, "reader-connection")["password"] == secret["password"]
    delete(kube, namespace, "reader")


def test_restore_killed_before_the_password_is_reset_ends_with_one_instance_and_its_password(
    kube, aws, own_namespace, start_operator
):
    first = start_operator()
    apply(kube, own_namespace, db("origin").replace("Delete", "Snapshot"))
    wait_ready(kube, "dbi", own_namespace, "origin")
    delete(kube, own_namespace, "origin")
    first.stop()

    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-create"})
    apply(kube, own_namespace, db("again", "  restoreFrom: {finalSnapshotOf: {name: origin}}\n"))
    wait_for(lambda: doomed.proc.poll() is not None, timeout=60, what="the operator to be killed")
    assert doomed.proc.returncode == -9
    doomed.proc = None
    cr = get(kube, "dbi", own_namespace, "again")
    # Restored, the old password not replaced yet, and no Secret holds anything.
    assert secret_data(kube, own_namespace, "again-connection") is None
    [(kind, identifier)] = owned_cloud_resources(aws, cr["metadata"]["uid"])
    assert last_password_sent(kube, identifier) is None

    start_operator()
    cr = wait_ready(kube, "dbi", own_namespace, "again", timeout=120)
    assert owned_cloud_resources(aws, cr["metadata"]["uid"]) == [(kind, identifier)]
    password = secret_data(kube, own_namespace, "again-connection")["password"]
    assert last_password_sent(kube, identifier) == password
    assert cr["status"]["restoredFrom"]["finalSnapshotOf"] == "origin"
    delete(kube, own_namespace, "again")


REFUSED = [
    (
        {"restoreFrom": {"snapshotIdentifier": "a", "finalSnapshotOf": {"name": "b"}}},
        "spec.restoreFrom takes exactly one of snapshotIdentifier, finalSnapshotOf, pointInTime",
    ),
    (
        {"restoreFrom": {"pointInTime": {"sourceRef": {"name": "b"}}}},
        "spec.restoreFrom.pointInTime takes either time or latest: true",
    ),
    (
        {
            "restoreFrom": {
                "pointInTime": {
                    "sourceRef": {"name": "b"},
                    "time": "2026-01-01T00:00:00Z",
                    "latest": True,
                }
            }
        },
        "spec.restoreFrom.pointInTime takes either time or latest: true",
    ),
    (
        {"replicaOf": {"name": "b"}, "restoreFrom": {"snapshotIdentifier": "a"}},
        "spec.replicaOf and spec.restoreFrom are exclusive; set one",
    ),
    ({"replicaOf": {"name": "self"}}, "spec.replicaOf must name another DatabaseInstance"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED)
def test_bad_sources_are_refused_at_apply(kube, namespace, extra, message):
    spec = json.dumps({"engine": "postgres", "instanceClass": "db.t3.micro", **extra})
    manifest = (
        "apiVersion: cloud.provisioner.dev/v1beta1\nkind: DatabaseInstance\n"
        f"metadata:\n  name: self\nspec: {spec}\n"
    )
    assert_refused(try_apply(kube, namespace, manifest, "--dry-run=server"), message)


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (
            "",
            "  restoreFrom: {snapshotIdentifier: a}\n",
            "spec.restoreFrom is set at creation only",
        ),
        (
            "  restoreFrom: {snapshotIdentifier: a}\n",
            "  restoreFrom: {snapshotIdentifier: b}\n",
            "spec.restoreFrom is immutable",
        ),
        ("", "  replicaOf: {name: b}\n", "spec.replicaOf cannot be added to an existing"),
        (
            "  replicaOf: {name: a}\n",
            "  replicaOf: {name: b}\n",
            "spec.replicaOf.name is immutable",
        ),
    ],
)
def test_sources_cannot_be_added_or_changed_later(kube, namespace, before, after, message):
    # Paused: no operator acts on it, the API server alone judges the update.
    paused = '    cloud.provisioner.dev/paused: "true"\n'
    apply(kube, namespace, db("fixed", before, paused))
    assert_refused(try_apply(kube, namespace, db("fixed", after, paused)), message)


# ---------------------------------------------------------------------------------------------
# The slow paths under the aws-like profile: a replica `creating`, its promotion `modifying`,
# a restore `creating` then its password reset, each waited for with the finalizer and Secret
# following the cloud.


def looks_until_ready(kube, cloud, namespace: str, name: str, timeout: float = 120) -> list:
    """(Ready status, Ready reason, cloud state) at each look until the resource is Ready."""
    ident = external_name(kube, "dbi", namespace, name)
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cr = get(kube, "dbi", namespace, name) or {}
        status, reason, _ = ready(cr)
        seen.append((status, reason, cloud.db_state(ident)))
        observed = (cr.get("status") or {}).get("observedGeneration")
        if status == "True" and observed == cr.get("metadata", {}).get("generation"):
            return seen
    raise AssertionError(f"{name} never went Ready; last seen {seen[-3:]}")


def test_replica_promotion_and_restore_follow_the_clouds_states(
    kube,
    aws_like,  # noqa: F811 - the fixture, imported from test_awslike
    own_namespace,
    start_operator,
):
    # At 60: 2 min creating, 1 min backing up, 10 min a replica or a restore, 5 min promoting.
    cloud = aws_like(
        RDS_SCALE,
        rds_create=120,
        rds_backup=60,
        rds_replica=600,
        rds_restore=600,
        rds_promote=300,
        rds_snapshot=60,
        rds_delete=60,
    )
    start_operator(endpoint_url=cloud.proxy.url)
    apply(kube, own_namespace, db("base").replace("Delete", "Snapshot"))
    wait_ready(kube, "dbi", own_namespace, "base", timeout=120)
    apply(kube, own_namespace, db("copy", "  replicaOf: {name: base}\n"))
    seen = looks_until_ready(kube, cloud, own_namespace, "copy")
    assert ("False", "Creating", "creating") in seen, seen
    assert cloud.operator_calls("rds.CreateDBInstanceReadReplica") == 1
    base_password = secret_data(kube, own_namespace, "base-connection")["password"]
    assert secret_data(kube, own_namespace, "copy-connection")["password"] == base_password

    merge_patch(kube, "dbi", own_namespace, "copy", '{"spec":{"replicaOf":null}}')
    seen = looks_until_ready(kube, cloud, own_namespace, "copy")
    assert any(state == "modifying" for *_, state in seen), seen
    assert cloud.operator_calls("rds.PromoteReadReplica") == 1
    copy = get(kube, "dbi", own_namespace, "copy")
    assert "replicaOf" not in copy["status"]
    # Usable while `modifying`; once promoted, the cloud names no source any more.
    promoted = wait_for(
        lambda: (
            (o := cloud.db(copy["status"]["externalName"]))
            and o["DBInstanceStatus"] == "available"
            and o
        ),
        timeout=60,
        what="the promotion to finish in the cloud",
    )
    assert "ReadReplicaSourceDBInstanceIdentifier" not in promoted

    kube.kubectl("delete", "dbi", "base", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "dbi", own_namespace, "base", timeout=120)
    apply(kube, own_namespace, db("back", "  restoreFrom: {finalSnapshotOf: {name: base}}\n"))
    seen = looks_until_ready(kube, cloud, own_namespace, "back")
    assert ("False", "Creating", "creating") in seen, seen
    assert cloud.operator_calls("rds.RestoreDBInstanceFromDBSnapshot") == 1
    ident = get(kube, "dbi", own_namespace, "back")["status"]["externalName"]
    password = secret_data(kube, own_namespace, "back-connection")["password"]
    assert password != base_password
    assert last_password_sent(kube, ident) == password
    kube.kubectl("delete", "dbi", "back", "copy", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "dbi", own_namespace, "back", timeout=120)
    wait_gone(kube, "dbi", own_namespace, "copy", timeout=120)


def test_a_restore_whose_password_secrets_manager_keeps_and_a_replica_of_it_refused(
    kube, operator, aws, namespace
):
    """Restored with `masterPassword.managedBy: SecretsManager`: the restore's answer is
    switched to Secrets Manager as the first change, and no Secret ever holds a password.
    A replica of it is refused before anything is made (RDS makes none)."""
    apply(
        kube, namespace, db("ledger").replace("deletionPolicy: Delete", "deletionPolicy: Snapshot")
    )
    wait_ready(kube, "dbi", namespace, "ledger")
    delete(kube, namespace, "ledger")
    kept = "  masterPassword: {managedBy: SecretsManager}\n"
    restore = "  restoreFrom: {finalSnapshotOf: {name: ledger}}\n"
    apply(kube, namespace, db("ledger-back", restore + kept))

    def kept_by_secrets_manager() -> dict | None:
        cr = get(kube, "dbi", namespace, "ledger-back") or {}
        arn = ((cr.get("status") or {}).get("masterUserSecret") or {}).get("arn")
        ready = condition(cr, "Ready") or {}
        return cr if arn and ready.get("status") == "True" else None

    back = wait_for(kept_by_secrets_manager, timeout=180, what="a restore kept by Secrets Manager")
    data = secret_data(kube, namespace, "ledger-back-connection")
    assert "password" not in data and "uri" not in data
    assert data["passwordSecretArn"] == back["status"]["masterUserSecret"]["arn"]
    secrets = client(aws, "secretsmanager")
    secret = secrets.get_secret_value(SecretId=data["passwordSecretArn"])
    assert json.loads(secret["SecretString"])["password"]

    apply(kube, namespace, db("ledger-replica", "  replicaOf: {name: ledger-back}\n"))
    refused = wait_condition(
        kube, "dbi", namespace, "ledger-replica", "Synced", "False", "InvalidSpec"
    )
    assert "keeps its master password in Secrets Manager" in condition(refused, "Synced")["message"]
    replica_id = refused["status"].get("externalName") or ""
    assert not replica_id or describe(aws, replica_id) is None
    delete(kube, namespace, "ledger-replica")
    delete(kube, namespace, "ledger-back")
