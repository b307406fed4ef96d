"""DatabaseInstance's network: the DB subnet group it is placed in and its VPC security groups.

`spec.network.subnetGroupName` names an existing DB subnet group, which the operator never
changes or deletes. `spec.network.subnetIds` has the operator make one for the instance alone,
named `provisioner-<instance id>` and tagged like the instance; its name is recorded in
`status.subnetGroup` (the kind's `recorded_status`) before it is made, and it is deleted once
the instance is gone. `spec.network.securityGroupIds` is mutable (ModifyDBInstance's
VpcSecurityGroupIds). Every subnet, security group and subnet group the spec names is looked
up before any create or modify, so that one that does not exist is named in `Synced=False`
instead of failing half-way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.crashpoints import crashpoint
from provisioner.kinds.contract import FieldDiff, OwnedResource, owner_of
from provisioner.kinds.tagging import tag_map, tag_pairs
from provisioner.model.resource import Resource

SECURITY_GROUPS_FIELD = "spec.network.securityGroupIds"
# `provisioner leaks` lists the operator-made DB subnet groups under this kind.
SUBNET_GROUP_KIND = "DBSubnetGroup"
# The status field that records the operator-made DB subnet group (before it is made).
RECORD = "subnetGroup"
PREFIX = "provisioner-"
# DescribeSubnets / DescribeSecurityGroups filters take at most 200 values ("You can specify
# up to 200 values per filter": https://docs.aws.amazon.com/AWSEC2/latest/APIReference/
# Using_Filtering.html); the CRD allows far fewer ids than that.
FILTER_VALUES = 200


@dataclass(frozen=True)
class NetworkSpec:
    subnet_group_name: str | None = None
    subnet_ids: tuple[str, ...] = ()
    # None: not managed (RDS's choice at create: the VPC's default security group).
    security_group_ids: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> NetworkSpec:
        raw = raw or {}
        groups = raw.get("securityGroupIds")
        return cls(
            subnet_group_name=raw.get("subnetGroupName") or None,
            subnet_ids=tuple(str(s) for s in raw.get("subnetIds") or ()),
            security_group_ids=None if groups is None else tuple(str(g) for g in groups),
        )


def derived_group_name(instance_id: str) -> str:
    """The operator-made DB subnet group's name (RDS allows 255 characters; an instance id
    has at most 63: https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/
    API_CreateDBSubnetGroup.html)."""
    return f"{PREFIX}{instance_id}"


def subnet_group_of(resource: Resource) -> str | None:
    """The DB subnet group the instance is created in (None: RDS's default)."""
    network: NetworkSpec = resource.spec.network
    if network.subnet_ids:
        return derived_group_name(resource.external_name)
    return network.subnet_group_name


def recorded(resource: Resource, instance: Mapping[str, Any] | None) -> str | None:
    """The operator-made DB subnet group of this resource, for `status.subnetGroup`: the one
    recorded already (kept until the resource is gone), the one the spec asks to make, or the
    instance's own when it has the derived name (None: none is ours to delete)."""
    derived = derived_group_name(resource.external_name)
    if resource.status.get(RECORD):
        return str(resource.status[RECORD])
    if resource.spec.network.subnet_ids:
        return derived
    if instance is not None:
        group = (instance.get("DBSubnetGroup") or {}).get("DBSubnetGroupName")
        if group == derived:
            return derived
    return None


def security_group_diffs(resource: Resource, instance: Mapping[str, Any]) -> list[FieldDiff]:
    desired = resource.spec.network.security_group_ids
    if desired is None:
        return []
    observed = sorted(
        g["VpcSecurityGroupId"]
        for g in instance.get("VpcSecurityGroups") or []
        if g.get("Status", "active") != "removing"
    )
    if observed == sorted(desired):
        return []
    return [FieldDiff(SECURITY_GROUPS_FIELD, observed, sorted(desired))]


class Network:
    """The EC2 and RDS calls of an instance's network, for one resource's account."""

    def __init__(self, aws: Aws, resource: Resource) -> None:
        self.aws = aws
        self.resource = resource
        self.ec2 = aws.client("ec2", resource.region, resource.account)
        self.rds = aws.client("rds", resource.region, resource.account)

    def check(self) -> None:
        """Refuse (InvalidSpec) a spec naming a subnet, security group or DB subnet group that
        does not exist in the instance's account and region."""
        network: NetworkSpec = self.resource.spec.network
        self.check_subnets(network.subnet_ids)
        self.check_security_groups(network.security_group_ids or ())
        if network.subnet_group_name and not network.subnet_ids:
            try:
                self.aws.call(
                    self.rds.describe_db_subnet_groups,
                    DBSubnetGroupName=network.subnet_group_name,
                )
            except errors.NotFoundError:
                raise self._missing(
                    "spec.network.subnetGroupName", "DB subnet group", [network.subnet_group_name]
                ) from None

    def check_subnets(self, ids: tuple[str, ...]) -> None:
        found = self._found(self.ec2.describe_subnets, "subnet-id", "Subnets", "SubnetId", ids)
        missing = [s for s in ids if s not in found]
        if missing:
            raise self._missing("spec.network.subnetIds", "subnet", missing)

    def check_security_groups(self, ids: tuple[str, ...] | list[str]) -> None:
        found = self._found(
            self.ec2.describe_security_groups, "group-id", "SecurityGroups", "GroupId", ids
        )
        missing = [g for g in ids if g not in found]
        if missing:
            raise self._missing("spec.network.securityGroupIds", "security group", missing)

    def _found(
        self, describe: Any, name: str, listing: str, key: str, ids: tuple[str, ...] | list[str]
    ) -> set[str]:
        """Those of `ids` that exist (a filter, not ids: one missing fails no call)."""
        found: set[str] = set()
        for start in range(0, len(ids), FILTER_VALUES):
            chosen = [{"Name": name, "Values": list(ids[start : start + FILTER_VALUES])}]
            answer = self.aws.call(describe, Filters=chosen)
            found |= {item[key] for item in answer.get(listing, [])}
        return found

    def _missing(self, field: str, what: str, names: list[str]) -> errors.TerminalError:
        plural = "s" if len(names) > 1 else ""
        return errors.TerminalError(
            f"{field}: {what}{plural} {', '.join(names)} not found in region "
            f"{self.resource.region} of the instance's account; nothing was created",
            "InvalidSpec",
        )

    def make_subnet_group(self) -> str | None:
        """The instance's DB subnet group made (or found made by an earlier attempt of ours)
        from `spec.network.subnetIds`; its name (None: the spec asks for none)."""
        resource = self.resource
        if not resource.spec.network.subnet_ids:
            return None
        name = derived_group_name(resource.external_name)
        # Looked up first: an earlier attempt's group is used as it is, another's never
        # (moto, unlike RDS, would overwrite it instead of answering AlreadyExists).
        owner = self._owner(name)
        if owner is not None:
            if owner != resource.uid:
                raise self._taken(name)
            return name
        try:
            self.aws.call(
                self.rds.create_db_subnet_group,
                DBSubnetGroupName=name,
                DBSubnetGroupDescription=(
                    f"made by the provisioner for {resource.kind} "
                    f"{resource.namespace}/{resource.name}"
                ),
                SubnetIds=list(resource.spec.network.subnet_ids),
                Tags=tag_pairs(resource.desired_tags),
            )
        except errors.ConflictError:
            if self._owner(name) != resource.uid:
                raise self._taken(name) from None
        crashpoint("after-subnet-group")
        return name

    @staticmethod
    def _taken(name: str) -> errors.TerminalError:
        return errors.TerminalError(
            f"DB subnet group {name} exists and was not made for this resource; name an "
            "existing group with spec.network.subnetGroupName instead",
            "NameConflict",
        )

    def delete_subnet_group(self, name: str) -> None:
        """Delete the operator-made DB subnet group `name` when it is this resource's own
        (tagged with its uid); nothing when it is gone already or not ours."""
        owner = self._owner(name)
        if owner is None or owner != self.resource.uid:
            return
        try:
            self.aws.call(self.rds.delete_db_subnet_group, DBSubnetGroupName=name)
        except errors.NotFoundError:
            return

    def _owner(self, name: str) -> str | None:
        """The owner-uid tag of DB subnet group `name` ("" untagged; None: no such group)."""
        try:
            found = self.aws.call(self.rds.describe_db_subnet_groups, DBSubnetGroupName=name)
        except errors.NotFoundError:
            return None
        arn = found["DBSubnetGroups"][0].get("DBSubnetGroupArn", "")
        tags = self.aws.call(self.rds.list_tags_for_resource, ResourceName=arn)["TagList"]
        return owner_of(tag_map(tags))


def list_subnet_groups(aws: Aws, region: str) -> Iterator[OwnedResource]:
    """The operator-made DB subnet groups (by their name's prefix) with their tags."""
    rds = aws.client("rds", region)
    for page in rds.get_paginator("describe_db_subnet_groups").paginate():
        for group in page.get("DBSubnetGroups", []):
            name = group["DBSubnetGroupName"]
            if not name.startswith(PREFIX):
                continue
            arn = group.get("DBSubnetGroupArn", "")
            tags = aws.call(rds.list_tags_for_resource, ResourceName=arn)["TagList"]
            yield OwnedResource(SUBNET_GROUP_KIND, name, tag_map(tags))
