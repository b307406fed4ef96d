"""RdsClient's restores and read replicas against moto's server."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from provisioner.aws import errors
from provisioner.kinds import rds_sources
from provisioner.kinds.rds import RdsClient
from tests.cloud.conftest import full_client

pytestmark = pytest.mark.cloud

SPEC = {"engine": "postgres", "instanceClass": "db.t3.micro"}


@pytest.fixture
def rds(aws):
    return RdsClient(aws)


def _tags(aws, arn):
    listing = aws.client("rds").list_tags_for_resource(ResourceName=arn)["TagList"]
    return {tag["Key"]: tag["Value"] for tag in listing}


def _deleted_with_final_snapshot(aws, rds, make_resource, name="orders", namespace="team-a"):
    """A DatabaseInstance created and deleted with deletionPolicy Snapshot: its final snapshot."""
    source = make_resource("DatabaseInstance", SPEC, name=name, namespace=namespace)
    rds.create(source, {"password": "old-password-0123456789"})
    rds.delete(source, rds.observe(source))
    snapshots = aws.client("rds").describe_db_snapshots(SnapshotType="manual")["DBSnapshots"]
    mine = [s for s in snapshots if s["DBSnapshotIdentifier"].startswith(source.external_name)]
    assert len(mine) == 1
    return mine[0]["DBSnapshotIdentifier"]


def test_final_snapshots_carry_the_ownership_tags(aws, rds, make_resource):
    snapshot = _deleted_with_final_snapshot(aws, rds, make_resource, name="tagged")
    found = aws.client("rds").describe_db_snapshots(DBSnapshotIdentifier=snapshot)["DBSnapshots"]
    tags = _tags(aws, found[0]["DBSnapshotArn"])
    assert tags["provisioner.dev/namespace"] == "team-a"
    assert tags["provisioner.dev/name"] == "tagged"
    assert tags["provisioner.dev/cluster"] == "test-cluster"


def test_final_snapshot_of_restores_the_newest_and_records_it(aws, rds, make_resource):
    name = f"ledger-{uuid.uuid4().hex[:6]}"
    older = make_resource("DatabaseInstance", SPEC, name=name)
    rds.create(older, {"password": "old-password-0123456789"})
    aws.client("rds").delete_db_instance(
        DBInstanceIdentifier=older.external_name,
        FinalDBSnapshotIdentifier=f"{older.external_name}-final-1000",
        SkipFinalSnapshot=False,
    )
    newest = _deleted_with_final_snapshot(aws, rds, make_resource, name=name)
    # The same name in another namespace is never found.
    _deleted_with_final_snapshot(aws, rds, make_resource, name=name, namespace="team-b")
    spec = {**SPEC, "restoreFrom": {"finalSnapshotOf": {"name": name}}}
    restored = make_resource("DatabaseInstance", spec, name="ledger-back")
    secrets = {"password": "never-sent-0123456789"}
    obs = rds.create(restored, secrets)
    assert "password" not in secrets  # the Secret stage sets a new one
    assert obs.status["restoredFrom"] == {"finalSnapshotOf": name, "snapshotIdentifier": newest}
    again = rds.observe(restored)
    assert again.owned_by(restored)
    assert again.status["restoredFrom"]["snapshotIdentifier"] == newest
    assert [d for d in again.diffs if d.field == "tags"] == []


def test_a_final_snapshot_of_another_namespace_is_not_found(aws, rds, make_resource):
    name = f"gone-{uuid.uuid4().hex[:6]}"
    _deleted_with_final_snapshot(aws, rds, make_resource, name=name, namespace="team-b")
    spec = {**SPEC, "restoreFrom": {"finalSnapshotOf": {"name": name}}}
    restored = make_resource("DatabaseInstance", spec, name="thief")
    with pytest.raises(errors.TerminalError, match=f"no final snapshot of DatabaseInstance {name}"):
        rds.create(restored, {"password": "x" * 24})
    assert not rds.observe(restored).exists


def test_a_foreign_snapshot_identifier_is_refused_naming_it(aws, rds, make_resource):
    foreign = _deleted_with_final_snapshot(aws, rds, make_resource, namespace="team-b")
    spec = {**SPEC, "restoreFrom": {"snapshotIdentifier": foreign}}
    restored = make_resource("DatabaseInstance", spec, name="thief")
    with pytest.raises(errors.TerminalError, match=f"snapshot {foreign} is not this namespace's"):
        rds.create(restored, {"password": "x" * 24})
    assert not rds.observe(restored).exists


def test_a_snapshot_offered_to_the_namespace_is_restored(aws, rds, make_resource):
    client = full_client(aws.client("rds"))
    ident = f"manual-{uuid.uuid4().hex[:8]}"
    client.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="admin",
        MasterUserPassword="admin-password-123",
    )
    untagged = f"{ident}-snap"
    client.create_db_snapshot(DBInstanceIdentifier=ident, DBSnapshotIdentifier=untagged)
    spec = {**SPEC, "restoreFrom": {"snapshotIdentifier": untagged}}
    restored = make_resource("DatabaseInstance", spec, name="offered")
    with pytest.raises(errors.TerminalError, match="not this namespace's"):
        rds.create(restored, {"password": "x" * 24})
    arn = client.describe_db_snapshots(DBSnapshotIdentifier=untagged)["DBSnapshots"][0][
        "DBSnapshotArn"
    ]
    client.add_tags_to_resource(
        ResourceName=arn, Tags=[{"Key": "provisioner.dev/adoptable-by", "Value": "team-a"}]
    )
    obs = rds.create(restored, {"password": "x" * 24})
    assert obs.status["restoredFrom"] == {"snapshotIdentifier": untagged}


def test_a_missing_snapshot_is_refused_naming_it(rds, make_resource):
    spec = {**SPEC, "restoreFrom": {"snapshotIdentifier": "no-such-snapshot"}}
    restored = make_resource("DatabaseInstance", spec, name="nothing")
    with pytest.raises(errors.TerminalError, match="no-such-snapshot is not this namespace's or"):
        rds.create(restored, {"password": "x" * 24})


def test_point_in_time_restores_from_the_resolved_source(aws, rds, make_resource):
    source = make_resource("DatabaseInstance", SPEC, name="live")
    rds.create(source, {"password": "old-password-0123456789"})
    arn = rds.observe(source).arn
    spec = {**SPEC, "restoreFrom": {"pointInTime": {"sourceRef": {"name": "live"}, "latest": True}}}
    clone = make_resource("DatabaseInstance", spec, name="preview")
    assert [d.key for d in clone.dependencies] == [rds_sources.RESTORE_SOURCE]
    assert clone.dependencies[0].until_created
    clone = dataclasses.replace(clone, resolved={rds_sources.RESTORE_SOURCE: arn})
    obs = rds.create(clone, {"password": "x" * 24})
    assert obs.status["restoredFrom"] == {
        "pointInTimeOf": "live",
        "sourceInstanceIdentifier": source.external_name,
        "time": "latest",
    }
    assert rds.observe(clone).exists


def test_point_in_time_from_another_region_is_refused(rds, make_resource):
    spec = {**SPEC, "restoreFrom": {"pointInTime": {"sourceRef": {"name": "x"}, "latest": True}}}
    clone = make_resource("DatabaseInstance", spec, name="far")
    arn = "arn:aws:rds:eu-west-1:123456789012:db:far-away"
    clone = dataclasses.replace(clone, resolved={rds_sources.RESTORE_SOURCE: arn})
    with pytest.raises(errors.TerminalError, match="lives in eu-west-1"):
        rds.create(clone, {"password": "x" * 24})


def test_replica_is_created_promoted_and_holds_its_source(aws, rds, make_resource):
    source = make_resource("DatabaseInstance", SPEC, name="primary")
    rds.create(source, {"password": "old-password-0123456789"})
    arn = rds.observe(source).arn
    replica = make_resource("DatabaseInstance", {**SPEC, "replicaOf": {"name": "primary"}})
    assert replica.dependencies[0].credentials
    replica = dataclasses.replace(replica, resolved={rds_sources.REPLICA_SOURCE: arn})
    secrets = {"password": "never-sent-0123456789"}
    rds.create(replica, secrets)
    assert "password" not in secrets
    obs = rds.observe(replica)
    assert obs.status["replicaOf"] == source.external_name
    assert [d.field for d in obs.diffs] == []

    # The source's deletion waits for it, naming it.
    with pytest.raises(errors.DeletionBlocked, match=replica.external_name):
        rds.delete(source, rds.observe(source))

    # Without replicaOf, promoting it is a change; then it is a replica no more.
    standalone = dataclasses.replace(replica, spec=dataclasses.replace(replica.spec, replica_of=""))
    obs = rds.observe(standalone)
    diffs = [d for d in obs.diffs if d.field == "spec.replicaOf"]
    assert diffs and diffs[0].observed == source.external_name and diffs[0].desired is None
    rds.update(standalone, obs, obs.diffs)
    obs = rds.observe(dataclasses.replace(standalone, status={"replicaOf": source.external_name}))
    assert obs.status["replicaOf"] is None  # removed from status
    assert [d.field for d in obs.diffs] == []
    rds.delete(source, rds.observe(source))  # no longer held
    rds.delete(standalone, obs)


def test_a_replica_is_deleted_without_a_final_snapshot_whatever_its_policy(aws, rds, make_resource):
    source = make_resource("DatabaseInstance", SPEC, name="primary")
    rds.create(source, {"password": "old-password-0123456789"})
    replica = make_resource("DatabaseInstance", {**SPEC, "replicaOf": {"name": "primary"}})
    assert replica.deletion_policy == "Snapshot"
    arn = rds.observe(source).arn
    replica = dataclasses.replace(replica, resolved={rds_sources.REPLICA_SOURCE: arn})
    rds.create(replica, {"password": "x" * 24})
    rds.delete(replica, rds.observe(replica))  # RDS takes no final snapshot of a replica
    assert not rds.observe(replica).exists
    client = aws.client("rds")
    taken = client.describe_db_snapshots(DBInstanceIdentifier=replica.external_name)
    assert taken["DBSnapshots"] == []
    rds.delete(source, rds.observe(source))  # nothing holds the source any more


def test_point_in_time_restores_to_a_given_time(aws, rds, make_resource):
    source = make_resource("DatabaseInstance", SPEC, name="live")
    rds.create(source, {"password": "old-password-0123456789"})
    when = "2026-01-02T03:04:05Z"
    pit = {"pointInTime": {"sourceRef": {"name": "live"}, "time": when}}
    clone = make_resource("DatabaseInstance", {**SPEC, "restoreFrom": pit}, name="at-time")
    resolved = {rds_sources.RESTORE_SOURCE: rds.observe(source).arn}
    obs = rds.create(dataclasses.replace(clone, resolved=resolved), {"password": "x" * 24})
    assert obs.status["restoredFrom"]["time"] == when
    assert rds.observe(clone).exists


def test_an_instance_made_before_copy_tags_still_leaves_a_tagged_final_snapshot(
    aws, rds, make_resource
):
    old = make_resource("DatabaseInstance", SPEC, name="older")
    client = aws.client("rds")
    client.create_db_instance(
        DBInstanceIdentifier=old.external_name,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="old-password-0123456789",
        Tags=[{"Key": k, "Value": v} for k, v in old.desired_tags.items()],
    )
    obs = rds.observe(old)
    assert obs.client_state["instance"]["CopyTagsToSnapshot"] is False
    rds.delete(old, obs)
    found = client.describe_db_snapshots(DBInstanceIdentifier=old.external_name)["DBSnapshots"]
    [snapshot] = found
    tags = _tags(aws, snapshot["DBSnapshotArn"])
    assert tags["provisioner.dev/name"] == "older"
    assert tags["provisioner.dev/namespace"] == "team-a"


def test_no_replica_of_an_instance_whose_password_secrets_manager_keeps(aws, rds, make_resource):
    """RDS makes no read replica of such an instance: refused naming it, nothing made."""
    kept = {**SPEC, "masterPassword": {"managedBy": "SecretsManager"}}
    source = make_resource("DatabaseInstance", kept, name="kept")
    rds.create(source, {})
    replica = make_resource("DatabaseInstance", {**SPEC, "replicaOf": {"name": "kept"}})
    arn = rds.observe(source).arn
    replica = dataclasses.replace(replica, resolved={rds_sources.REPLICA_SOURCE: arn})
    with pytest.raises(errors.TerminalError, match="keeps its master password in Secrets Manager"):
        rds.create(replica, {"password": "x" * 24})
    assert not rds.observe(replica).exists
