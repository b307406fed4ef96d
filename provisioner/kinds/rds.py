"""DatabaseInstance: one RDS DB instance named `resource.external_name`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from provisioner.aws import errors
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws
from provisioner.kinds import rds_network, rds_parameters, rds_password, rds_settings, rds_sources
from provisioner.kinds.contract import (
    FieldDiff,
    KindDescriptor,
    Observation,
    OwnedResource,
)
from provisioner.kinds.rds_instance import (
    MODIFY_PARAM,
    DatabaseSpec,
    observation,
    tags_of,
)
from provisioner.kinds.tagging import tag_changes, tag_pairs
from provisioner.model import naming
from provisioner.model.account import AccountRef
from provisioner.model.connection_secret import database_uri
from provisioner.model.resource import Resource

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
            # What was recorded, or is about to be made, beyond the instance (its subnet group
            # and parameter group).
            return Observation(
                exists=False,
                status={
                    rds_network.RECORD: rds_network.recorded(resource, None),
                    **rds_parameters.absent_status(resource),
                },
            )
        instance = found["DBInstances"][0]
        return observation(
            resource, instance, rds_parameters.read(self.aws, rds, resource, instance)
        )

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
                    if rds_parameters.batchable(instance):  # else: its own look
                        found[instance["DBInstanceIdentifier"]] = instance
                if not page.get("Marker"):
                    break
                marker = {"Marker": page["Marker"]}
        return found

    def observed(self, resource: Resource, described: Any) -> Observation:
        return observation(
            resource, described, rds_parameters.read(None, None, resource, described)
        )

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation:
        spec = resource.spec
        network = rds_network.Network(self.aws, resource)
        network.check()  # before anything is made
        network.make_subnet_group()
        optional = {
            "EngineVersion": spec.engine_version,
            "DBName": spec.database_name,
            "Port": spec.port,
            "StorageType": spec.storage_type,
            "Iops": spec.iops,
            "DBSubnetGroupName": rds_network.subnet_group_of(resource),
            "VpcSecurityGroupIds": list(spec.network.security_group_ids or ()) or None,
            "PreferredMaintenanceWindow": spec.maintenance_window,
            "PreferredBackupWindow": spec.backup_window,
            "AutoMinorVersionUpgrade": spec.auto_minor_version_upgrade,
        }
        rds = self._rds(resource)
        optional.update(rds_parameters.create_group(self.aws, rds, resource))
        if spec.restore_from is not None or spec.replica_of:
            # Made from another's data, with its master password: none is set here, the
            # connection Secret stage sets a new one (or, for a replica, takes the source's).
            secrets.pop("password", None)
            made = rds_sources.Sources(self.aws, rds).made_from(resource, optional)
            return rds_parameters.after_create(resource, observation(resource, made))
        created = self.aws.call(
            rds.create_db_instance,
            DBInstanceIdentifier=resource.external_name,
            Engine=spec.engine,
            DBInstanceClass=spec.instance_class,
            AllocatedStorage=spec.allocated_storage_gib,
            MasterUsername=spec.master_username,
            **rds_password.create_params(spec.master_password, secrets),
            MultiAZ=spec.multi_az,
            PubliclyAccessible=spec.publicly_accessible,
            BackupRetentionPeriod=spec.backup_retention_days,
            DeletionProtection=spec.deletion_protection,
            CopyTagsToSnapshot=True,  # final snapshots carry the ownership tags
            Tags=tag_pairs(resource.desired_tags),
            **spec.encryption.create_params(),
            **{k: v for k, v in optional.items() if v is not None},
        )["DBInstance"]
        # Its answer describes the new instance (`creating`), tagged as asked.
        created.setdefault("TagList", tag_pairs(resource.desired_tags))
        return rds_parameters.after_create(resource, observation(resource, created))

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        instance = observation.client_state["instance"]
        changes = {diff.field: diff for diff in diffs}
        tags = changes.pop("tags", None)
        rds = self._rds(resource)
        if tags is not None:
            to_set, to_remove = tag_changes(tags_of(instance), tags.desired)
            arn = instance["DBInstanceArn"]
            if to_set:
                self.aws.call(rds.add_tags_to_resource, ResourceName=arn, Tags=tag_pairs(to_set))
            if to_remove:
                self.aws.call(rds.remove_tags_from_resource, ResourceName=arn, TagKeys=to_remove)
        parameters = changes.pop(rds_parameters.FIELD, None)
        reboot = changes.pop(rds_parameters.REBOOT, None)
        if parameters is not None:
            rds_parameters.apply(self.aws, rds, resource, instance)
        if changes:
            self._modify(resource, instance, changes)
        if reboot is not None:
            rds_parameters.reboot(self.aws, rds, resource, instance)

    def _modify(
        self, resource: Resource, instance: dict[str, Any], changes: dict[str, FieldDiff]
    ) -> None:
        rds = self._rds(resource)
        switch = changes.pop(rds_password.FIELD, None)
        if not changes and switch is None:
            return
        spec = resource.spec
        versions = rds_settings.version_params(
            spec.engine, spec.allow_major_version_upgrade, changes.get("spec.engineVersion")
        )
        if rds_network.SECURITY_GROUPS_FIELD in changes:
            groups = changes[rds_network.SECURITY_GROUPS_FIELD].desired
            rds_network.Network(self.aws, resource).check_security_groups(groups)
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
        if rds_sources.promoted(self.aws, rds, resource, instance, changes):
            return
        params = {MODIFY_PARAM[field]: diff.desired for field, diff in changes.items()}
        handed = self.handover.prepare(resource.spec.master_password, switch, params)
        params.update(versions)
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
        instance = observation.client_state["instance"]
        sources = rds_sources.Sources(self.aws, self._rds(resource))
        sources.hold_for_replicas(instance)
        if instance.get("DeletionProtection"):
            # The spec no longer asks for it (the reconciler holds the deletion while it
            # does): RDS refuses to delete a protected instance.
            self.aws.call(
                self._rds(resource).modify_db_instance,
                DBInstanceIdentifier=name,
                DeletionProtection=False,
                ApplyImmediately=True,
            )
        if resource.deletion_policy == "Snapshot" and not rds_sources.is_replica(instance):
            sources.tag_final_snapshot(instance)
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

    def remove_leftovers(self, resource: Resource, observation: Observation) -> str:
        """Once the instance is gone: its operator-made DB subnet group and parameter group
        ("" when both are gone, else why the deletion still waits)."""
        if name := observation.status.get(rds_network.RECORD):
            rds_network.Network(self.aws, resource).delete_subnet_group(name)
        if not rds_parameters.wanted(resource):
            return ""
        return rds_parameters.remove_group(self.aws, self._rds(resource), resource)

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


def list_instances(aws: Aws, region: str) -> Iterator[OwnedResource]:
    """The instances, and what the operator makes beside them: DB subnet groups and DB
    parameter groups (for `provisioner leaks`)."""
    rds = aws.client("rds", region)
    for page in rds.get_paginator("describe_db_instances").paginate():
        for db in page.get("DBInstances", []):
            yield OwnedResource(KIND.kind, db["DBInstanceIdentifier"], tags_of(db))
    yield from rds_network.list_subnet_groups(aws, region)
    yield from rds_parameters.list_groups(aws, region)


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
    dependencies=rds_sources.dependencies,
    describe_create=rds_sources.planned_create,
    list_resources=list_instances,
    error_codes=ErrorCodes(
        not_found=frozenset(
            {
                "DBInstanceNotFound",
                "DBInstanceNotFoundFault",
                "DBSnapshotNotFound",
                "DBSubnetGroupNotFoundFault",
            }
        )
        | rds_parameters.NOT_FOUND,
        conflict=frozenset(
            {
                "DBInstanceAlreadyExists",
                "DBInstanceAlreadyExistsFault",
                "DBSubnetGroupAlreadyExists",
                "DBSubnetGroupAlreadyExistsFault",
            }
        )
        | rds_parameters.CONFLICT,
        retryable=frozenset({"InvalidDBInstanceState", "InvalidDBInstanceStateFault"})
        | rds_parameters.RETRYABLE,
    ),
    on_localstack=False,
    creating_states=frozenset({"", "creating"}),
    recorded_status=(rds_network.RECORD, *rds_parameters.RECORDED),
    requests={rds_parameters.REBOOT: rds_parameters.STATUS_REBOOT},
    access_actions=rds_password.ACCESS,
    access_arns=rds_password.access_arns,
    deletion_protected=lambda spec: spec.deletion_protection,
)
