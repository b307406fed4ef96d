"""DatabaseInstance.spec.parameters: a DB parameter group of the operator's own per instance.

The group (`naming.db_parameter_group_name`, our tags, the family of the instance's engine
and major version) holds exactly the parameters of the spec; every other parameter keeps its
engine default. Dynamic parameters (ApplyType `dynamic`) are applied at once (ApplyMethod
`immediate`), static ones at the next reboot (`pending-reboot`), and `status.pendingReboot`
names them until the instance has rebooted (its DBParameterGroups' ParameterApplyStatus is
no longer `pending-reboot`). The annotation `cloud.provisioner.dev/reboot-requested-at` asks
for that reboot: once per value, `status.lastRebootRequest` records the value handled.

The record is `status.parameterGroup`, written before the group is made (at create and when
parameters are added to an instance that had none, `KindDescriptor.recorded_status`). The
group goes only after the instance is gone (`remove_group`); a crash between the group and
the instance leaves the record, and the next pass uses (or deletes) the same group.

Removing a parameter from the spec resets it to its engine default (ResetDBParameterGroup).
Removing `spec.parameters` altogether keeps the group attached with no parameter of its own
(all reset): switching an instance to another group needs a reboot, keeping it needs none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.crashpoints import crashpoint
from provisioner.kinds import rds_settings
from provisioner.kinds.contract import FieldDiff, Observation, OwnedResource, owner_of
from provisioner.kinds.tagging import tag_map, tag_pairs
from provisioner.model import annotations as annotation_keys
from provisioner.model import naming
from provisioner.model.resource import Resource

FIELD = "spec.parameters"
# The FieldDiff that asks for a reboot: the annotation's value, not yet handled.
REBOOT = "reboot"
STATUS_GROUP = "parameterGroup"
STATUS_PENDING = "pendingReboot"
STATUS_REBOOT = "lastRebootRequest"
KIND = "DBParameterGroup"
# Written to status right before the calls that make or remove the group.
RECORDED = (STATUS_GROUP, STATUS_PENDING)
NOT_FOUND = frozenset({"DBParameterGroupNotFound", "DBParameterGroupNotFoundFault"})
CONFLICT = frozenset({"DBParameterGroupAlreadyExists", "DBParameterGroupAlreadyExistsFault"})
# A group still in use (by an instance being deleted) cannot go yet.
RETRYABLE = frozenset({"InvalidDBParameterGroupState", "InvalidDBParameterGroupStateFault"})
# "You can modify up to 20 parameters in a single request" (ModifyDBParameterGroup), and as
# many per ResetDBParameterGroup (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/
# API_ModifyDBParameterGroup.html, API_ResetDBParameterGroup.html).
BATCH = 20
# AWS's own groups, never ours.
DEFAULT_PREFIX = "default."
# AWS's answer to a name the family does not have: "Could not find parameter with name: x".
UNKNOWN_NAME = re.compile(r"parameter with name:?\s*([A-Za-z0-9_.\-]+)", re.IGNORECASE)


def parse(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """spec.parameters as sorted (name, value) pairs; None when the spec has none."""
    raw = spec.get("parameters")
    if raw is None:
        return None
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def group_name(resource: Resource) -> str:
    return naming.db_parameter_group_name(resource.namespace, resource.name, resource.uid)


def wanted(resource: Resource) -> bool:
    """Whether the instance has (or is to have) a group of ours."""
    return resource.spec.parameters is not None or bool(resource.status.get(STATUS_GROUP))


def family(engine: str, version: str) -> str:
    """The parameter group family of an engine version: postgres16, postgres9.6, mysql8.0,
    mariadb10.11 (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/
    USER_WorkingWithParamGroups.html): the engine and its major version."""
    return f"{engine}{rds_settings.major(engine, version)}"


def default_family(aws: Aws, rds: Any, engine: str) -> str:
    """The family of the version RDS picks when none is asked for (DescribeDBEngineVersions,
    DefaultOnly)."""
    answer = aws.call(rds.describe_db_engine_versions, Engine=engine, DefaultOnly=True)
    versions = answer.get("DBEngineVersions") or []
    if not versions:
        raise errors.TerminalError(
            f"the cloud names no default version of {engine}: set spec.engineVersion"
        )
    return str(versions[0]["DBParameterGroupFamily"])


# ---------------------------------------------------------------------------------------------
# Looking.


def after_create(resource: Resource, obs: Observation) -> Observation:
    """An instance just created: its group holds the spec's parameters, nothing waits for a
    reboot, and a reboot annotation already there asks for nothing (it has just booted)."""
    if resource.spec.parameters is not None:
        obs.status.update({STATUS_GROUP: group_name(resource), STATUS_PENDING: None})
    asked = resource.annotation(annotation_keys.REBOOT_REQUESTED_AT)
    if asked:
        obs.status[STATUS_REBOOT] = asked
    obs.diffs = [d for d in obs.diffs if d.field != REBOOT]
    return obs


def batchable(instance: Mapping[str, Any]) -> bool:
    """Whether a batched describe may stand in for the instance's look: not when it uses a
    group other than AWS's default ones (maybe ours, whose parameters a look reads)."""
    in_use, _ = attached(instance)
    return not in_use or in_use.startswith(DEFAULT_PREFIX)


def absent_status(resource: Resource) -> dict[str, Any]:
    """Status recorded right before the create: the group the create makes."""
    if resource.spec.parameters is None:
        return {}
    return {STATUS_GROUP: group_name(resource)}


def attached(instance: Mapping[str, Any]) -> tuple[str, str]:
    """(the instance's parameter group, its ParameterApplyStatus)."""
    groups = instance.get("DBParameterGroups") or [{}]
    first = groups[0]
    return str(first.get("DBParameterGroupName") or ""), str(
        first.get("ParameterApplyStatus") or ""
    )


def user_parameters(aws: Aws, rds: Any, name: str, source: str | None = "user") -> list[Any]:
    """DescribeDBParameters of the group, every page (all, or of `source` only)."""
    found: list[Any] = []
    marker: dict[str, str] = {}
    chosen = {"Source": source} if source else {}
    while True:
        page = aws.call(rds.describe_db_parameters, DBParameterGroupName=name, **chosen, **marker)
        found += page.get("Parameters") or []
        if not page.get("Marker"):
            return found
        marker = {"Marker": page["Marker"]}


def read(
    aws: Aws | None, rds: Any, resource: Resource, instance: Mapping[str, Any]
) -> dict[str, Any]:
    """What the parameters look like now: {"inUse", "applyStatus", "values", "static"}; {}
    (no call) when the instance has no group of ours and the spec asks for none. The values
    of our group are read only while the instance uses it (`aws` None: no call at all, the
    instance uses another group); the ApplyType of every parameter only when a write is
    coming (AWS lists the whole family, a few pages)."""
    if not wanted(resource):
        return {}
    in_use, apply_status = attached(instance)
    looked: dict[str, Any] = {
        "inUse": in_use,
        "applyStatus": apply_status,
        "values": {},
        "static": [],
    }
    if aws is None or in_use != group_name(resource):
        return looked
    try:
        listing = user_parameters(aws, rds, in_use)
        looked["values"] = _values(listing)
        if looked["values"] != dict(resource.spec.parameters or ()):
            listing = user_parameters(aws, rds, in_use, source=None)
    except errors.NotFoundError:
        return looked  # gone meanwhile: the instance no longer has it either
    looked["static"] = sorted(
        str(p["ParameterName"]) for p in listing if p.get("ApplyType") == "static"
    )
    return looked


def _values(listing: list[Any]) -> dict[str, str]:
    """The parameters set in the group (Source `user`; moto names no source)."""
    return {
        str(p["ParameterName"]): str(p["ParameterValue"])
        for p in listing
        if "ParameterValue" in p and p.get("Source", "user") == "user"
    }


def diffs(resource: Resource, looked: Mapping[str, Any]) -> list[FieldDiff]:
    found: list[FieldDiff] = []
    if looked:
        ours = group_name(resource)
        desired_values = dict(resource.spec.parameters or ())
        observed = {"parameterGroup": looked["inUse"], "parameters": looked["values"]}
        desired = {"parameterGroup": ours, "parameters": desired_values}
        if observed != desired:
            found.append(FieldDiff(FIELD, observed, desired))
    asked = resource.annotation(annotation_keys.REBOOT_REQUESTED_AT)
    handled = str(resource.status.get(STATUS_REBOOT) or "")
    if asked and asked != handled:
        found.append(FieldDiff(REBOOT, handled, asked))
    return found


def status(resource: Resource, looked: Mapping[str, Any]) -> dict[str, Any]:
    """status.parameterGroup and status.pendingReboot: the names recorded as written with
    `pending-reboot` while the instance says so, and those about to be (a write records
    them first)."""
    if not looked:
        return {}
    recorded = [str(n) for n in resource.status.get(STATUS_PENDING) or []]
    pending = set(recorded) if looked["applyStatus"] == "pending-reboot" else set()
    return {
        STATUS_GROUP: group_name(resource),
        STATUS_PENDING: sorted(pending | upcoming(resource, looked)) or None,
    }


def upcoming(resource: Resource, looked: Mapping[str, Any]) -> set[str]:
    """The parameters a write would leave waiting for a reboot: all of them when the group
    is not attached yet (a new group applies at the next reboot), else the static ones
    that change."""
    desired = dict(resource.spec.parameters or ())
    if looked["inUse"] != group_name(resource):
        return set(desired)
    values = looked["values"]
    changing = {n for n in set(desired) | set(values) if desired.get(n) != values.get(n)}
    return changing & set(looked["static"])


# ---------------------------------------------------------------------------------------------
# Writing.


def ensure_group(aws: Aws, rds: Any, resource: Resource, family_name: str) -> str:
    """Our group, made (tagged) when it does not exist; refused when someone else's has its
    name."""
    name = group_name(resource)
    try:
        aws.call(
            rds.create_db_parameter_group,
            DBParameterGroupName=name,
            DBParameterGroupFamily=family_name,
            Description=f"provisioner: parameters of {resource.namespace}/{resource.name}",
            Tags=tag_pairs(resource.desired_tags),
        )
        crashpoint("after-parameter-group")
        return name
    except errors.ConflictError:
        pass
    if _owner(aws, rds, name) != resource.uid:
        raise errors.ConflictError(f"DB parameter group {name} exists and is not ours")
    return name


def _owner(aws: Aws, rds: Any, name: str) -> str:
    """The owner-uid tag of the group (""); NotFoundError when there is no such group (moto
    answers an empty list where AWS says DBParameterGroupNotFound)."""
    found = aws.call(rds.describe_db_parameter_groups, DBParameterGroupName=name)
    groups = found.get("DBParameterGroups") or []
    if not groups:
        raise errors.NotFoundError(
            f"DB parameter group {name} not found", "DBParameterGroupNotFound"
        )
    arn = groups[0]["DBParameterGroupArn"]
    tags = aws.call(rds.list_tags_for_resource, ResourceName=arn).get("TagList") or []
    return owner_of(tag_map(tags))


def write(
    aws: Aws,
    rds: Any,
    resource: Resource,
    current: Mapping[str, str],
    apply_types: Mapping[str, str] | None,
) -> None:
    """Set the spec's parameters and reset the others of ours. `apply_types` (name ->
    ApplyType) None: the instance does not use the group yet, every value waits for its boot."""
    name = group_name(resource)
    desired = dict(resource.spec.parameters or ())

    def method(parameter: str) -> str:
        if apply_types is None or apply_types.get(parameter) == "static":
            return "pending-reboot"
        return "immediate"

    changed = sorted(n for n, v in desired.items() if current.get(n) != v)
    for start in range(0, len(changed), BATCH):
        batch = [
            {"ParameterName": n, "ParameterValue": desired[n], "ApplyMethod": method(n)}
            for n in changed[start : start + BATCH]
        ]
        try:
            aws.call(rds.modify_db_parameter_group, DBParameterGroupName=name, Parameters=batch)
        except errors.TerminalError as exc:
            raise _unknown(exc, [p["ParameterName"] for p in batch]) from None
    removed = sorted(set(current) - set(desired))
    for start in range(0, len(removed), BATCH):
        batch = [
            {"ParameterName": n, "ApplyMethod": method(n)} for n in removed[start : start + BATCH]
        ]
        aws.call(rds.reset_db_parameter_group, DBParameterGroupName=name, Parameters=batch)


def _unknown(exc: errors.TerminalError, names: list[str]) -> errors.TerminalError:
    """The cloud's refusal, naming the parameter it does not know when it says which."""
    found = UNKNOWN_NAME.search(exc.message)
    if found:
        return errors.TerminalError(
            f"spec.parameters: {found.group(1)} is no parameter of this engine version "
            f"({exc.message})",
            exc.code,
        )
    return errors.TerminalError(
        f"spec.parameters ({', '.join(names)}) refused: {exc.message}", exc.code
    )


def check_names(resource: Resource, listing: list[Any]) -> dict[str, str]:
    """ApplyType by parameter name, from the group's full listing. Where the cloud lists the
    family's parameters (AWS: every one, with its ApplyType), a name the spec asks for and
    the listing lacks is refused before any write."""
    types = {str(p["ParameterName"]): str(p.get("ApplyType") or "") for p in listing}
    if any(types.values()):
        unknown = sorted(n for n, _ in resource.spec.parameters or () if n not in types)
        if unknown:
            raise errors.TerminalError(
                f"spec.parameters: {', '.join(unknown)} "
                f"{'is no parameter' if len(unknown) == 1 else 'are no parameters'} of the "
                f"group's family",
                "InvalidParameterValue",
            )
    return types


def create_group(aws: Aws, rds: Any, resource: Resource) -> dict[str, str]:
    """Before CreateDBInstance: our group with the spec's parameters; the create's extra
    argument ({} when the spec has none)."""
    spec = resource.spec
    if spec.parameters is None:
        return {}
    chosen = (
        family(spec.engine, spec.engine_version)
        if spec.engine_version
        else default_family(aws, rds, spec.engine)
    )
    name = ensure_group(aws, rds, resource, chosen)
    check_names(resource, user_parameters(aws, rds, name, source=None))
    write(aws, rds, resource, _values(user_parameters(aws, rds, name)), None)
    return {"DBParameterGroupName": name}


def apply(aws: Aws, rds: Any, resource: Resource, instance: Mapping[str, Any]) -> None:
    """The group made when missing, its parameters as the spec asks, then attached."""
    ours = group_name(resource)
    in_use = attached(instance)[0] == ours
    if not in_use:  # (in use: it exists, and it is ours)
        ensure_group(aws, rds, resource, family(resource.spec.engine, instance["EngineVersion"]))
    listing = user_parameters(aws, rds, ours, source=None)
    types = check_names(resource, listing)
    write(aws, rds, resource, _values(listing), types if in_use else None)
    if not in_use:
        aws.call(
            rds.modify_db_instance,
            DBInstanceIdentifier=resource.external_name,
            DBParameterGroupName=ours,
            ApplyImmediately=True,
        )


def reboot(aws: Aws, rds: Any, resource: Resource, instance: Mapping[str, Any]) -> None:
    state = instance.get("DBInstanceStatus", "")
    if state != "available":
        raise errors.RetryableError(
            f"instance is {state}; the reboot waits", "InvalidDBInstanceState"
        )
    aws.call(rds.reboot_db_instance, DBInstanceIdentifier=resource.external_name)


def remove_group(aws: Aws, rds: Any, resource: Resource) -> str:
    """After the instance is gone: our group deleted. "" when none is left, else why the
    deletion waits."""
    names = {str(resource.status.get(STATUS_GROUP) or "")}
    if resource.spec.parameters is not None:
        names.add(group_name(resource))
    for name in sorted(n for n in names if n):
        try:
            if _owner(aws, rds, name) != resource.uid:
                continue  # not ours: left as it is
            aws.call(rds.delete_db_parameter_group, DBParameterGroupName=name)
        except errors.NotFoundError:
            continue
        except errors.RetryableError as exc:
            return f"deleting DB parameter group {name}: {exc}"
    return ""


def list_groups(aws: Aws, region: str) -> Iterator[OwnedResource]:
    """Every DB parameter group but AWS's own, with its tags (for `provisioner leaks`)."""
    rds = aws.client("rds", region)
    for page in rds.get_paginator("describe_db_parameter_groups").paginate():
        for group in page.get("DBParameterGroups", []):
            if group["DBParameterGroupName"].startswith(DEFAULT_PREFIX):
                continue
            arn = group["DBParameterGroupArn"]
            tags = aws.call(rds.list_tags_for_resource, ResourceName=arn).get("TagList")
            yield OwnedResource(KIND, group["DBParameterGroupName"], tag_map(tags))
