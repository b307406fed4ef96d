"""What one RDS DB instance is to the operator: the spec it is made from (`DatabaseSpec`), the
fields a change may set (`MUTABLE`), and the observation made from a DescribeDBInstances
element (`observation`: state, connection details, status fields and the fields that differ
from the spec). provisioner/kinds/rds.py speaks to RDS with them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.kinds import rds_network, rds_parameters, rds_password, rds_settings, rds_sources
from provisioner.kinds.contract import FieldDiff, Observation, adoptable_by, owner_of
from provisioner.kinds.tagging import tag_diffs, tag_map
from provisioner.model.resource import Resource


@dataclass(frozen=True)
class DatabaseSpec:
    engine: str
    instance_class: str
    allocated_storage_gib: int = 20
    storage_type: str | None = None
    iops: int | None = None
    engine_version: str | None = None
    master_username: str = "app"
    database_name: str | None = None
    port: int | None = None
    multi_az: bool = False
    publicly_accessible: bool = False
    backup_retention_days: int = 7
    instance_identifier: str | None = None
    network: rds_network.NetworkSpec = dataclasses.field(default_factory=rds_network.NetworkSpec)
    encryption: rds_settings.EncryptionSpec = dataclasses.field(
        default_factory=rds_settings.EncryptionSpec
    )
    deletion_protection: bool = False
    maintenance_window: str | None = None
    backup_window: str | None = None
    auto_minor_version_upgrade: bool | None = None
    allow_major_version_upgrade: bool = False
    # spec.parameters (provisioner/kinds/rds_parameters.py); None: the engine's defaults.
    parameters: tuple[tuple[str, str], ...] | None = None
    restore_from: rds_sources.RestoreFrom | None = None
    replica_of: str = ""
    master_password: rds_password.PasswordSpec = dataclasses.field(
        default_factory=rds_password.PasswordSpec
    )

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> DatabaseSpec:
        return cls(
            instance_identifier=spec.get("instanceIdentifier") or None,
            engine=spec["engine"],
            instance_class=spec["instanceClass"],
            allocated_storage_gib=int((spec.get("storage") or {}).get("sizeGiB", 20)),
            storage_type=(spec.get("storage") or {}).get("type") or None,
            iops=int(iops) if (iops := (spec.get("storage") or {}).get("iops")) else None,
            engine_version=spec.get("engineVersion") or None,
            master_username=spec.get("masterUsername", "app"),
            database_name=spec.get("databaseName") or None,
            port=int(spec["port"]) if spec.get("port") is not None else None,
            multi_az=bool(spec.get("multiAZ", False)),
            publicly_accessible=bool(spec.get("publiclyAccessible", False)),
            backup_retention_days=int(spec.get("backupRetentionDays", 7)),
            network=rds_network.NetworkSpec.parse(spec.get("network")),
            encryption=rds_settings.EncryptionSpec.parse(spec.get("encryption")),
            deletion_protection=bool(spec.get("deletionProtection", False)),
            maintenance_window=spec.get("maintenanceWindow") or None,
            backup_window=spec.get("backupWindow") or None,
            auto_minor_version_upgrade=spec.get("autoMinorVersionUpgrade"),
            allow_major_version_upgrade=bool(spec.get("allowMajorVersionUpgrade", False)),
            parameters=rds_parameters.parse(spec),
            restore_from=rds_sources.RestoreFrom.parse(spec.get("restoreFrom")),
            replica_of=rds_sources.replica_of(spec),
            master_password=rds_password.PasswordSpec.parse(spec),
        )


# Mutable spec fields: (contract field, spec attribute, DescribeDBInstances key).
# A spec value of None means "whatever the cloud chose".
MUTABLE = (
    ("spec.instanceClass", "instance_class", "DBInstanceClass"),
    ("spec.storage.sizeGiB", "allocated_storage_gib", "AllocatedStorage"),
    ("spec.storage.type", "storage_type", "StorageType"),
    ("spec.storage.iops", "iops", "Iops"),
    ("spec.engineVersion", "engine_version", "EngineVersion"),
    ("spec.port", "port", "Port"),
    ("spec.multiAZ", "multi_az", "MultiAZ"),
    ("spec.publiclyAccessible", "publicly_accessible", "PubliclyAccessible"),
    ("spec.backupRetentionDays", "backup_retention_days", "BackupRetentionPeriod"),
    ("spec.deletionProtection", "deletion_protection", "DeletionProtection"),
    ("spec.maintenanceWindow", "maintenance_window", "PreferredMaintenanceWindow"),
    ("spec.backupWindow", "backup_window", "PreferredBackupWindow"),
    ("spec.autoMinorVersionUpgrade", "auto_minor_version_upgrade", "AutoMinorVersionUpgrade"),
)
# ModifyDBInstance takes the DescribeDBInstances names, except for the port and security groups.
MODIFY_PARAM = {field: key for field, _, key in MUTABLE} | {
    "spec.port": "DBPortNumber",
    rds_network.SECURITY_GROUPS_FIELD: "VpcSecurityGroupIds",
}

# States in which the instance exists and serves connections (Ready stays True);
# "configuring-*" states count too.
USABLE_STATES = set(
    "available modifying backing-up upgrading rebooting storage-optimization "
    "resetting-master-credentials".split()
)


def observation(
    resource: Resource, instance: dict[str, Any], parameters: Mapping[str, Any] | None = None
) -> Observation:
    state = instance.get("DBInstanceStatus", "")
    endpoint = instance.get("Endpoint") or {}
    host, port = endpoint.get("Address", ""), str(endpoint.get("Port", ""))
    arn = instance.get("DBInstanceArn", "")
    return Observation(
        exists=True,
        owner_uid=owner_of(tags_of(instance)),
        adoptable_by=adoptable_by(tags_of(instance)),
        available=state in USABLE_STATES or state.startswith("configuring-"),
        deleting=state == "deleting",
        state=state,
        arn=arn,
        diffs=_diffs(resource, instance) + rds_parameters.diffs(resource, parameters or {}),
        connection={
            "host": host,
            "port": port,
            "username": instance.get("MasterUsername", ""),
            "database": instance.get("DBName") or "",
            "engine": instance.get("Engine", ""),
            "arn": arn,
            **rds_password.connection(instance),
        },
        status={
            "endpoint": f"{host}:{port}" if host else "",
            "pendingChanges": _pending(instance),
            rds_network.RECORD: rds_network.recorded(resource, instance),
            **rds_settings.encryption_status(instance),
            **rds_parameters.status(resource, parameters or {}),
            **rds_sources.status(resource, instance),
            **rds_password.status(instance),
        },
        applying=_pending(instance),
        client_state={"instance": instance},
    )


def _pending(instance: dict[str, Any]) -> str:
    """The modifications the cloud accepted and has not applied yet ("" when none)."""
    pending = instance.get("PendingModifiedValues") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(pending.items()) if k != "MasterUserPassword")


def tags_of(instance: Mapping[str, Any]) -> dict[str, str]:
    return tag_map(instance.get("TagList"))


def _current(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance's values, pending modifications counted as already applied."""
    current = {key: instance.get(key) for _, _, key in MUTABLE}
    current["Port"] = (instance.get("Endpoint") or {}).get("Port")
    pending = instance.get("PendingModifiedValues") or {}
    current.update({key: pending[key] for key in current if key in pending})
    return current


def _same(field: str, observed: object, desired: object) -> bool:
    if (same := rds_settings.same(field, observed, desired)) is not None:
        return same
    if field == "spec.engineVersion":
        # "15" asks for any 15.x: the cloud picks the minor version.
        return str(observed) == desired or str(observed).startswith(f"{desired}.")
    return observed == desired


def _diffs(resource: Resource, instance: dict[str, Any]) -> list[FieldDiff]:
    current = _current(instance)
    diffs = []
    for field, attr, key in MUTABLE:
        desired, observed = getattr(resource.spec, attr), current[key]
        # Skip what the spec leaves to the cloud and what the cloud does not report yet.
        if desired is None or observed is None or _same(field, observed, desired):
            continue
        diffs.append(FieldDiff(field, observed, desired))
    diffs += rds_network.security_group_diffs(resource, instance)
    diffs += rds_password.diffs(resource.spec.master_password, instance)
    desired_tags = resource.desired_tags | rds_sources.kept_tags(instance)
    diffs += rds_sources.diffs(resource, instance)
    return diffs + tag_diffs(tags_of(instance), desired_tags)
