"""DatabaseInstance: one RDS DB instance named `resource.external_name`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws
from provisioner.kinds import rds_password
from provisioner.kinds.contract import (
    FieldDiff,
    KindDescriptor,
    Observation,
    OwnedResource,
    adoptable_by,
    owner_of,
)
from provisioner.kinds.tagging import tag_changes, tag_diffs
from provisioner.model import naming
from provisioner.model.account import AccountRef
from provisioner.model.connection_secret import database_uri
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
)
# ModifyDBInstance takes the DescribeDBInstances names, except for the port.
MODIFY_PARAM = {field: key for field, _, key in MUTABLE} | {"spec.port": "DBPortNumber"}

# States in which the instance exists and serves connections (Ready stays True);
# "configuring-*" states count too.
USABLE_STATES = set(
    "available modifying backing-up upgrading rebooting storage-optimization "
    "resetting-master-credentials".split()
)
# After a storage change AWS refuses the next one "for six (6) hours or until storage
# optimization has completed on the instance, whichever is longer"
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/USER_PIOPS.StorageTypes.html).
STORAGE_RETRY_SECONDS = 600.0
# DescribeDBInstances' largest page ("Minimum 20, maximum 100"), and as many identifiers per
# db-instance-id filter (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/
# API_DescribeDBInstances.html).
DESCRIBE_PAGE = 100


class RdsClient(rds_password.KeptPassword):
    tags_on_create = True  # CreateDBInstance takes Tags

    def __init__(self, aws: Aws) -> None:
        self.aws = aws
        self.handover = rds_password.Handover()

    def _rds(self, resource: Resource) -> Any:
        return self.aws.client("rds", resource.region, resource.account)

    def observe(self, resource: Resource) -> Observation:
        rds = self._rds(resource)
        try:
            found = self.aws.call(
                rds.describe_db_instances, DBInstanceIdentifier=resource.external_name
            )
        except errors.NotFoundError:
            return Observation(exists=False)
        return _observation(resource, found["DBInstances"][0])

    def describe_many(
        self, region: str, names: Sequence[str], account: AccountRef | None = None
    ) -> dict[str, Any]:
        """One DescribeDBInstances per 100 identifiers (its largest page), tags included."""
        rds, found = self.aws.client("rds", region, account), {}
        for start in range(0, len(names), DESCRIBE_PAGE):
            chosen = [
                {"Name": "db-instance-id", "Values": list(names[start : start + DESCRIBE_PAGE])}
            ]
            marker: dict[str, str] = {}
            while True:
                page = self.aws.call(
                    rds.describe_db_instances, Filters=chosen, MaxRecords=DESCRIBE_PAGE, **marker
                )
                for instance in page.get("DBInstances", []):
                    found[instance["DBInstanceIdentifier"]] = instance
                if not page.get("Marker"):
                    break
                marker = {"Marker": page["Marker"]}
        return found

    def observed(self, resource: Resource, described: Any) -> Observation:
        return _observation(resource, described)

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation:
        spec = resource.spec
        optional = {
            "EngineVersion": spec.engine_version,
            "DBName": spec.database_name,
            "Port": spec.port,
            "StorageType": spec.storage_type,
            "Iops": spec.iops,
        }
        created = self.aws.call(
            self._rds(resource).create_db_instance,
            DBInstanceIdentifier=resource.external_name,
            Engine=spec.engine,
            DBInstanceClass=spec.instance_class,
            AllocatedStorage=spec.allocated_storage_gib,
            MasterUsername=spec.master_username,
            **rds_password.create_params(spec.master_password, secrets),
            MultiAZ=spec.multi_az,
            PubliclyAccessible=spec.publicly_accessible,
            BackupRetentionPeriod=spec.backup_retention_days,
            Tags=[{"Key": k, "Value": v} for k, v in resource.desired_tags.items()],
            **{k: v for k, v in optional.items() if v is not None},
        )["DBInstance"]
        # Its answer describes the new instance (`creating`), tagged as asked.
        created.setdefault(
            "TagList", [{"Key": k, "Value": v} for k, v in resource.desired_tags.items()]
        )
        return _observation(resource, created)

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        instance = observation.client_state["instance"]
        changes = {diff.field: diff for diff in diffs}
        tags = changes.pop("tags", None)
        rds = self._rds(resource)
        if tags is not None:
            to_set, to_remove = tag_changes(_tags(instance), tags.desired)
            arn = instance["DBInstanceArn"]
            if to_set:
                pairs = [{"Key": k, "Value": v} for k, v in to_set.items()]
                self.aws.call(rds.add_tags_to_resource, ResourceName=arn, Tags=pairs)
            if to_remove:
                self.aws.call(rds.remove_tags_from_resource, ResourceName=arn, TagKeys=to_remove)
        switch = changes.pop(rds_password.FIELD, None)
        if not changes and switch is None:
            return
        storage = changes.get("spec.storage.sizeGiB")
        if storage is not None and storage.desired < storage.observed:
            raise errors.TerminalError(
                f"storage.sizeGiB cannot shrink from {storage.observed} to {storage.desired}",
                "InvalidParameterCombination",
            )
        if (state := instance.get("DBInstanceStatus", "")) != "available":
            raise errors.RetryableError(
                f"instance is {state}; will retry", "InvalidDBInstanceState"
            )
        params = {MODIFY_PARAM[field]: diff.desired for field, diff in changes.items()}
        handed = self.handover.prepare(resource.spec.master_password, switch, params)
        version = changes.get("spec.engineVersion")
        if version is not None and _is_major_upgrade(resource.spec.engine, version):
            params["AllowMajorVersionUpgrade"] = True
        try:
            self.aws.call(
                rds.modify_db_instance,
                DBInstanceIdentifier=resource.external_name,
                ApplyImmediately=True,
                **params,
            )
            self.handover.made(resource.uid, handed, switch)
        except errors.TerminalError as exc:
            if "storage" in exc.message and "optimiz" in exc.message:
                raise errors.RetryLaterError(
                    f"{exc.message} AWS allows one storage change per six hours, and only once "
                    "the previous one is optimized; the other changes wait with it",
                    exc.code,
                    retry_after=STORAGE_RETRY_SECONDS,
                ) from None
            raise

    def delete(self, resource: Resource, observation: Observation) -> None:
        if observation.deleting or resource.deletion_policy == "Retain":
            return
        name = resource.external_name
        if resource.deletion_policy == "Snapshot":
            # SkipFinalSnapshot=False is AWS's default; moto needs it spelled out.
            final = {
                "FinalDBSnapshotIdentifier": f"{name}-final-{int(time.time())}",
                "SkipFinalSnapshot": False,
            }
        else:
            final = {"SkipFinalSnapshot": True, "DeleteAutomatedBackups": True}
        try:
            self.aws.call(
                self._rds(resource).delete_db_instance, DBInstanceIdentifier=name, **final
            )
        except errors.NotFoundError:
            return

    def with_password(self, connection: dict[str, str], password: str) -> dict[str, str]:
        """The connection Secret's values: the cloud's details plus password and URI."""
        uri = database_uri(
            connection["engine"],
            connection["username"],
            password,
            connection["host"],
            connection["port"],
            connection["database"],
        )
        return {**connection, "password": password, "uri": uri}

    def set_password(self, resource: Resource, password: str) -> None:
        self.aws.call(
            self._rds(resource).modify_db_instance,
            DBInstanceIdentifier=resource.external_name,
            MasterUserPassword=password,
            ApplyImmediately=True,
        )


def _observation(resource: Resource, instance: dict[str, Any]) -> Observation:
    state = instance.get("DBInstanceStatus", "")
    endpoint = instance.get("Endpoint") or {}
    host, port = endpoint.get("Address", ""), str(endpoint.get("Port", ""))
    arn = instance.get("DBInstanceArn", "")
    return Observation(
        exists=True,
        owner_uid=owner_of(_tags(instance)),
        adoptable_by=adoptable_by(_tags(instance)),
        available=state in USABLE_STATES or state.startswith("configuring-"),
        deleting=state == "deleting",
        state=state,
        arn=arn,
        diffs=_diffs(resource, instance),
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
            **rds_password.status(instance),
        },
        applying=_pending(instance),
        client_state={"instance": instance},
    )


def _pending(instance: dict[str, Any]) -> str:
    """The modifications the cloud accepted and has not applied yet ("" when none)."""
    pending = instance.get("PendingModifiedValues") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(pending.items()) if k != "MasterUserPassword")


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("TagList") or []}


def _current(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance's values, pending modifications counted as already applied."""
    current = {key: instance.get(key) for _, _, key in MUTABLE}
    current["Port"] = (instance.get("Endpoint") or {}).get("Port")
    pending = instance.get("PendingModifiedValues") or {}
    current.update({key: pending[key] for key in current if key in pending})
    return current


def _same(field: str, observed: object, desired: object) -> bool:
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
    password = rds_password.diffs(resource.spec.master_password, instance)
    return diffs + password + tag_diffs(_tags(instance), resource.desired_tags)


def _is_major_upgrade(engine: str, version: FieldDiff) -> bool:
    return _major(engine, version.observed) != _major(engine, version.desired)


def _major(engine: str, version: str) -> str:
    """RDS major version: "16" for postgres >= 10, else two parts ("9.6", "8.0", "10.11")."""
    parts = str(version).split(".")
    if engine == "postgres" and parts[0].isdigit() and int(parts[0]) >= 10:
        return parts[0]
    return ".".join(parts[:2])


def list_instances(aws: Aws, region: str) -> Iterator[OwnedResource]:
    rds = aws.client("rds", region)
    for page in rds.get_paginator("describe_db_instances").paginate():
        for db in page.get("DBInstances", []):
            yield OwnedResource(KIND.kind, db["DBInstanceIdentifier"], _tags(db))


KIND = KindDescriptor(
    kind="DatabaseInstance",
    plural="databaseinstances",
    short_names=("dbi",),
    service="rds",
    parse_spec=DatabaseSpec.parse,
    default_deletion_policy="Snapshot",
    name_field="instanceIdentifier",
    derive_name=lambda namespace, name, uid, spec: naming.db_instance_identifier(
        namespace, name, uid
    ),
    client=RdsClient,
    list_resources=list_instances,
    error_codes=ErrorCodes(
        not_found=frozenset(
            {"DBInstanceNotFound", "DBInstanceNotFoundFault", "DBSnapshotNotFound"}
        ),
        conflict=frozenset({"DBInstanceAlreadyExists", "DBInstanceAlreadyExistsFault"}),
        retryable=frozenset({"InvalidDBInstanceState", "InvalidDBInstanceStateFault"}),
    ),
    on_localstack=False,
    creating_states=frozenset({"", "creating"}),
    access_actions=rds_password.ACCESS,
    access_arns=rds_password.access_arns,
)
