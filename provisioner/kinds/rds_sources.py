"""DatabaseInstance.spec.restoreFrom and spec.replicaOf: instances made from another's data.

`restoreFrom` (create-time only: the CRD refuses any change to it) is one of:
- `snapshotIdentifier`: RestoreDBInstanceFromDBSnapshot. A snapshot identifier is a cloud name
  a tenant could use to read another team's data, so a snapshot is restored only when its tags
  say it belongs to this namespace: taken by this operator's cluster from an instance of this
  namespace (`provisioner.dev/namespace` and `provisioner.dev/cluster`, which final snapshots
  carry), or offered to it by whoever owns it (`provisioner.dev/adoptable-by: <namespace>`, as
  for adoption). Any other snapshot, an untagged one included: Synced=False InvalidSpec naming
  it, and nothing is restored.
- `finalSnapshotOf: {name}`: the newest final snapshot (`<identifier>-final-<unix time>`) of
  the deleted DatabaseInstance of that name in this namespace, found by those same tags and
  its name tag. Instances are created with CopyTagsToSnapshot, so their final snapshots carry
  the instance's ownership tags.
- `pointInTime: {sourceRef: {name}, time | latest}`: RestoreDBInstanceToPointInTime from the
  instance of a DatabaseInstance of this namespace, once that is Ready, in the same account
  (the dependencies stage) and region. Needed only until the instance exists.

The restore call itself tags the new instance with `provisioner.dev/restored-from`, from which
every look fills `status.restoredFrom`: a crash right after the call loses nothing. The new
instance carries the snapshot's master password: the create hands no password to the cloud,
so the connection Secret stage sets a new one, cloud first, before any Secret holds it.

`replicaOf: {name}`: CreateDBInstanceReadReplica of the instance of a DatabaseInstance of this
namespace, once that is Ready (same account and region). The replica is tagged
`provisioner.dev/replica-of`; its connection Secret carries its own host and the source's
credentials (read from the source's connection Secret). Removing `replicaOf` promotes it
(PromoteReadReplica, then the tag goes). Deleting a source waits while replicas made by the
operator (tagged so) still replicate from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.kinds.contract import ADOPTABLE_BY_TAG, FieldDiff
from provisioner.kinds.tagging import tag_map, tag_pairs
from provisioner.model.resource import CLUSTER_TAG, NAME_TAG, NAMESPACE_TAG, Dependency, Resource

RESTORED_FROM_TAG = "provisioner.dev/restored-from"
REPLICA_OF_TAG = "provisioner.dev/replica-of"
# Tags of ours that the operator sets once and keeps (never drift).
KEPT_TAGS = (RESTORED_FROM_TAG, REPLICA_OF_TAG)
RESTORE_SOURCE = "restore/source"
REPLICA_SOURCE = "replica/source"
FIELD = "spec.replicaOf"
FINAL_SNAPSHOT = re.compile(r"-final-[0-9]+$")
# RDS tag values: at most 256 Unicode characters
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/USER_Tagging.html).
TAG_VALUE_MAX = 256
# DescribeDBSnapshots' largest page ("Minimum 20, maximum 100",
# https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_DescribeDBSnapshots.html).
SNAPSHOT_PAGE = 100


@dataclass(frozen=True)
class RestoreFrom:
    snapshot_identifier: str = ""
    final_snapshot_of: str = ""
    source: str = ""  # pointInTime.sourceRef.name
    time: str = ""  # pointInTime.time (RFC 3339); "" with latest
    latest: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> RestoreFrom | None:
        if not raw:
            return None
        pit = raw.get("pointInTime") or {}
        return cls(
            snapshot_identifier=str(raw.get("snapshotIdentifier") or ""),
            final_snapshot_of=str((raw.get("finalSnapshotOf") or {}).get("name") or ""),
            source=str((pit.get("sourceRef") or {}).get("name") or ""),
            time=str(pit.get("time") or ""),
            latest=bool(pit.get("latest")),
        )

    def describe(self) -> str:
        if self.snapshot_identifier:
            return f"snapshot {self.snapshot_identifier}"
        if self.final_snapshot_of:
            return f"the newest final snapshot of DatabaseInstance {self.final_snapshot_of}"
        when = "its latest restorable time" if self.latest else self.time
        return f"DatabaseInstance {self.source} at {when}"


def replica_of(raw: Mapping[str, Any]) -> str:
    return str((raw.get("replicaOf") or {}).get("name") or "")


def dependencies(spec: Any) -> list[Dependency]:
    """The DatabaseInstances of the namespace this one is made from."""
    found = []
    if spec.restore_from is not None and spec.restore_from.source:
        found.append(
            Dependency(
                RESTORE_SOURCE,
                "DatabaseInstance",
                spec.restore_from.source,
                "point-in-time source DatabaseInstance",
                until_created=True,
            )
        )
    if spec.replica_of:
        found.append(
            Dependency(
                REPLICA_SOURCE,
                "DatabaseInstance",
                spec.replica_of,
                "source DatabaseInstance",
                credentials=True,
            )
        )
    return found


def _source_identifier(resource: Resource, key: str) -> str:
    """The source's instance identifier from its ARN (arn:aws:rds:<region>:<account>:db:<id>);
    refused when it lives in another region."""
    arn = resource.resolved.get(key, "")
    parts = arn.split(":")
    if len(parts) < 7:
        raise errors.RetryableError(f"the source's ARN is not known yet ({arn!r})")
    if parts[3] != resource.region:
        raise errors.TerminalError(
            f"the source instance {parts[6]} lives in {parts[3]}, this resource in "
            f"{resource.region}: both must be in one region",
            "InvalidParameterCombination",
        )
    return parts[6]


def _ours(tags: Mapping[str, str], resource: Resource) -> bool:
    """Taken by this cluster's operator from an instance of `resource`'s namespace."""
    return (
        tags.get(NAMESPACE_TAG) == resource.namespace
        and tags.get(CLUSTER_TAG) == resource.cluster_id
    )


def belongs(tags: Mapping[str, str], resource: Resource) -> bool:
    """Whether a snapshot's tags say it may be restored into `resource`'s namespace."""
    return _ours(tags, resource) or tags.get(ADOPTABLE_BY_TAG) == resource.namespace


def _usable(snapshot: Mapping[str, Any], resource: Resource) -> str:
    name = snapshot["DBSnapshotIdentifier"]
    status = snapshot.get("Status", "")
    if status != "available":
        raise errors.RetryableError(
            f"snapshot {name} is {status or 'not available'}; the restore waits for it",
            "InvalidDBSnapshotState",
        )
    engine = snapshot.get("Engine", "")
    if engine and engine != resource.spec.engine:
        raise errors.TerminalError(
            f"snapshot {name} is of engine {engine}, spec.engine is {resource.spec.engine}",
            "InvalidParameterCombination",
        )
    return str(name)


# CreateDBInstance's parameters that restores and read replicas take too.
PLACED = (
    "Port",
    "StorageType",
    "Iops",
    "DBSubnetGroupName",
    "VpcSecurityGroupIds",
    "DBParameterGroupName",
)


class Sources:
    """The cloud calls of restores and replicas, for RdsClient."""

    def __init__(self, aws: Aws, rds: Any) -> None:
        self.aws = aws
        self.rds = rds

    def snapshot_tags(self, snapshot: Mapping[str, Any]) -> dict[str, str]:
        if "TagList" in snapshot:
            return tag_map(snapshot.get("TagList"))
        listed = self.aws.call(
            self.rds.list_tags_for_resource, ResourceName=snapshot["DBSnapshotArn"]
        )
        return tag_map(listed.get("TagList"))

    def named_snapshot(self, resource: Resource, name: str) -> str:
        try:
            found = self.aws.call(self.rds.describe_db_snapshots, DBSnapshotIdentifier=name)
        except errors.NotFoundError:
            found = {}
        snapshots = found.get("DBSnapshots") or []
        # One answer for a foreign snapshot and a missing one: a tenant learns nothing of
        # other namespaces' snapshots, not even that they exist.
        if not snapshots or not belongs(self.snapshot_tags(snapshots[0]), resource):
            raise errors.TerminalError(
                f"snapshot {name} is not this namespace's or does not exist: only snapshots "
                f"the operator took of an instance of namespace {resource.namespace}, or "
                f"tagged {ADOPTABLE_BY_TAG}={resource.namespace}, can be restored",
                "SnapshotNotAllowed",
            )
        return _usable(snapshots[0], resource)

    def final_snapshot(self, resource: Resource, name: str) -> str:
        """The newest final snapshot of the deleted DatabaseInstance `name` of the namespace."""
        newest: dict[str, Any] | None = None
        marker: dict[str, str] = {}
        while True:
            page = self.aws.call(
                self.rds.describe_db_snapshots,
                SnapshotType="manual",
                MaxRecords=SNAPSHOT_PAGE,
                **marker,
            )
            for snapshot in page.get("DBSnapshots") or []:
                if not FINAL_SNAPSHOT.search(snapshot["DBSnapshotIdentifier"]):
                    continue
                tags = self.snapshot_tags(snapshot)
                if not (_ours(tags, resource) and tags.get(NAME_TAG) == name):
                    continue
                if newest is None or _taken(snapshot) > _taken(newest):
                    newest = snapshot
            if not page.get("Marker"):
                break
            marker = {"Marker": page["Marker"]}
        if newest is None:
            raise errors.TerminalError(
                f"no final snapshot of DatabaseInstance {name} of namespace "
                f"{resource.namespace} was found",
                "DBSnapshotNotFound",
            )
        return _usable(newest, resource)

    def made_from(self, resource: Resource, optional: Mapping[str, Any]) -> dict[str, Any]:
        """Start the restore or create the replica; the new instance's description."""
        spec = resource.spec
        common: dict[str, Any] = {
            "DBInstanceClass": spec.instance_class,
            "AllocatedStorage": spec.allocated_storage_gib,
            "MultiAZ": spec.multi_az,
            "PubliclyAccessible": spec.publicly_accessible,
            "CopyTagsToSnapshot": True,
            "DeletionProtection": spec.deletion_protection,
        }
        # Where it is placed and configured, as a create would be (the rest, windows and
        # automatic upgrades, is set by the first look's changes).
        for key in PLACED:
            if optional.get(key) is not None:
                common[key] = optional[key]
        if spec.restore_from is None:
            return self.replicate(resource, common)
        common["BackupRetentionPeriod"] = spec.backup_retention_days
        return self.restore(resource, common)

    def tag_final_snapshot(self, instance: Mapping[str, Any]) -> None:
        """Before a deletion with a final snapshot: an instance made before the operator set
        CopyTagsToSnapshot gets it now, so that its final snapshot carries the ownership tags
        (`finalSnapshotOf` finds it by them). A refusal while it applies is retried."""
        if instance.get("CopyTagsToSnapshot") is False:
            self.aws.call(
                self.rds.modify_db_instance,
                DBInstanceIdentifier=instance["DBInstanceIdentifier"],
                CopyTagsToSnapshot=True,
                ApplyImmediately=True,
            )

    def hold_for_replicas(self, instance: Mapping[str, Any]) -> None:
        """Deleting a source waits while replicas the operator made replicate from it."""
        replicas = self.replicas_of(instance)
        if replicas:
            raise errors.DeletionBlocked(
                f"waiting for its read replicas {', '.join(replicas)} to be deleted or "
                "promoted (remove their spec.replicaOf) first"
            )

    def restore(self, resource: Resource, common: dict[str, Any]) -> dict[str, Any]:
        """Start the restore `spec.restoreFrom` asks for; the new instance's description."""
        source: RestoreFrom = resource.spec.restore_from
        tags = dict(resource.desired_tags)
        if source.source:
            ident = _source_identifier(resource, RESTORE_SOURCE)
            when: dict[str, Any] = (
                {"UseLatestRestorableTime": True} if source.latest else {"RestoreTime": source.time}
            )
            at = "latest" if source.latest else source.time
            tags[RESTORED_FROM_TAG] = f"sourceRef={source.source} instance={ident} time={at}"
            return dict(
                self.aws.call(
                    self.rds.restore_db_instance_to_point_in_time,
                    SourceDBInstanceIdentifier=ident,
                    TargetDBInstanceIdentifier=resource.external_name,
                    Tags=tag_pairs(tags),
                    **when,
                    **common,
                )["DBInstance"]
            )
        if source.final_snapshot_of:
            snapshot = self.final_snapshot(resource, source.final_snapshot_of)
            value = f"finalSnapshotOf={source.final_snapshot_of} snapshot={snapshot}"
        else:
            snapshot = self.named_snapshot(resource, source.snapshot_identifier)
            value = f"snapshot={snapshot}"
        tags[RESTORED_FROM_TAG] = value[:TAG_VALUE_MAX]
        return dict(
            self.aws.call(
                self.rds.restore_db_instance_from_db_snapshot,
                DBInstanceIdentifier=resource.external_name,
                DBSnapshotIdentifier=snapshot,
                Tags=tag_pairs(tags),
                **common,
            )["DBInstance"]
        )

    def replicate(self, resource: Resource, common: dict[str, Any]) -> dict[str, Any]:
        """Create the read replica `spec.replicaOf` asks for; its description."""
        ident = _source_identifier(resource, REPLICA_SOURCE)
        source = self.aws.call(self.rds.describe_db_instances, DBInstanceIdentifier=ident)
        if any(found.get("MasterUserSecret") for found in source.get("DBInstances") or []):
            raise errors.TerminalError(
                f"spec.replicaOf: {ident} keeps its master password in Secrets Manager, and RDS "
                "makes no read replica of such an instance (https://docs.aws.amazon.com/AmazonRDS/"
                "latest/UserGuide/rds-secrets-manager.html#rds-secrets-manager-limitations)",
                "InvalidParameterCombination",
            )
        tags = {**resource.desired_tags, REPLICA_OF_TAG: ident}
        return dict(
            self.aws.call(
                self.rds.create_db_instance_read_replica,
                DBInstanceIdentifier=resource.external_name,
                SourceDBInstanceIdentifier=ident,
                Tags=tag_pairs(tags),
                **common,
            )["DBInstance"]
        )

    def promote(self, resource: Resource, instance: Mapping[str, Any]) -> None:
        """PromoteReadReplica, then the replica tag goes (a crash between: promoted again,
        which AWS refuses while promoting and never needs after)."""
        self.aws.call(self.rds.promote_read_replica, DBInstanceIdentifier=resource.external_name)
        self.aws.call(
            self.rds.remove_tags_from_resource,
            ResourceName=instance["DBInstanceArn"],
            TagKeys=[REPLICA_OF_TAG],
        )

    def replicas_of(self, instance: Mapping[str, Any]) -> list[str]:
        """The replicas the operator made that still replicate from `instance`."""
        listed = list(instance.get("ReadReplicaDBInstanceIdentifiers") or [])
        found = []
        for ident in listed:
            try:
                described = self.aws.call(
                    self.rds.describe_db_instances, DBInstanceIdentifier=ident
                )
            except errors.NotFoundError:
                continue
            for replica in described.get("DBInstances") or []:
                if is_replica(replica) and replica.get("DBInstanceStatus") != "deleting":
                    found.append(str(ident))
        return found


def _taken(snapshot: Mapping[str, Any]) -> tuple[int, str]:
    """When a final snapshot was taken: the unix time its identifier ends with, then its
    creation time."""
    unix = int(str(snapshot["DBSnapshotIdentifier"]).rsplit("-", 1)[1])
    return unix, str(snapshot.get("SnapshotCreateTime") or "")


def is_replica(instance: Mapping[str, Any]) -> bool:
    """A read replica the operator made, not promoted since: RDS names its source, and our tag
    is still on it (moto keeps naming the source after a promotion; AWS does not)."""
    source = instance.get("ReadReplicaSourceDBInstanceIdentifier")
    return bool(source) and REPLICA_OF_TAG in tag_map(instance.get("TagList"))


def promoted(
    aws: Aws, rds: Any, resource: Resource, instance: Mapping[str, Any], changes: dict[str, Any]
) -> bool:
    """Promote the replica when that is among the changes; the others wait for the next pass
    (the instance is `modifying` meanwhile)."""
    if changes.pop(FIELD, None) is None:
        return False
    Sources(aws, rds).promote(resource, instance)
    return True


def kept_tags(instance: Mapping[str, Any]) -> dict[str, str]:
    """The tags of ours the instance keeps whatever the spec says."""
    tags = tag_map(instance.get("TagList"))
    return {k: tags[k] for k in KEPT_TAGS if k in tags}


def status(resource: Resource, instance: Mapping[str, Any]) -> dict[str, Any]:
    """status.restoredFrom and status.replicaOf, from the instance's tags and RDS's word; each
    left out when it has no value and status has none (None removes one status has)."""
    restored = tag_map(instance.get("TagList")).get(RESTORED_FROM_TAG, "")
    fields = dict(part.split("=", 1) for part in restored.split() if "=" in part)
    names = {
        "snapshot": "snapshotIdentifier",
        "finalSnapshotOf": "finalSnapshotOf",
        "sourceRef": "pointInTimeOf",
        "instance": "sourceInstanceIdentifier",
        "time": "time",
    }
    source = instance.get("ReadReplicaSourceDBInstanceIdentifier")
    found = {
        "restoredFrom": {names[k]: v for k, v in fields.items() if k in names} or None,
        "replicaOf": str(source) if is_replica(instance) else None,
    }
    return {k: v for k, v in found.items() if v is not None or k in resource.status}


def diffs(resource: Resource, instance: Mapping[str, Any]) -> list[FieldDiff]:
    """A replica whose spec no longer names a source: promoting it is a change to make."""
    if resource.spec.replica_of or not is_replica(instance):
        return []
    return [FieldDiff(FIELD, instance["ReadReplicaSourceDBInstanceIdentifier"], None)]


def planned_create(resource: Resource) -> str:
    """How plan-only names a create that is a restore or a replica ("" for a plain one)."""
    if resource.spec.restore_from is not None:
        return f", restored from {resource.spec.restore_from.describe()}"
    if resource.spec.replica_of:
        return f", a read replica of DatabaseInstance {resource.spec.replica_of}"
    return ""
