"""RDS in the aws-like cloud: the states AWS shows that moto skips, and the refusals.

`creating` then `backing-up` before `available`; `modifying` with the new values in
PendingModifiedValues and the old ones still current until applied
(`resetting-master-credentials` for a password alone, or a rotation of the password Secrets
Manager keeps; `modifying` while Secrets Manager takes the password or gives it back, and with
the new values shown at once for deletion protection, windows and security groups);
`storage-optimization` after a storage change, and no further storage change for a while;
`deleting` before DBInstanceNotFound, the identifier refused meanwhile; snapshots `creating`
before `available`; ModifyDBInstance refused (InvalidDBInstanceState) while the instance is
busy. Restores and read replicas are `creating` (then `backing-up`) like a create; a restore
from a snapshot still `creating` is refused (InvalidDBSnapshotState); a promotion is
`modifying`, after which the instance names no source and its source no longer lists it (moto
keeps both).
"""

from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ET

from aiohttp import web

from provisioner_dev.awslike_http import (
    Call,
    forwarded_headers,
    plain,
    request_id,
    xml_answer,
)
from provisioner_dev.awslike_rds_model import (
    BUSY,
    MAKERS,
    RdsModel,
    current_value,
    parse_xml,
    rds_tag,
)
from provisioner_dev.awslike_rds_parameters import (
    ACTIONS,
    handle_parameters,
)

RENDERED = (
    *MAKERS,
    "PromoteReadReplica",
    "ModifyDBInstance",
    "DescribeDBInstances",
    "DescribeDBSnapshots",
    "CreateDBSnapshot",
    "RebootDBInstance",
)


async def handle_rds(rds: RdsModel, call: Call) -> web.StreamResponse:
    """An RDS query-API call, answered as AWS would answer it now."""
    if call.action in ACTIONS:
        return await handle_parameters(rds.parameters, call)
    text = call.body.decode(errors="replace")
    params = {k: v[0] for k, v in urllib.parse.parse_qs(text).items()}
    ident = params.get("DBInstanceIdentifier") or params.get("TargetDBInstanceIdentifier", "")
    key = (call.account, call.region, ident)
    now = call.clock()
    headers = forwarded_headers(call.request)
    refused = _busy_refusal(rds, call, key, params, now)
    if refused is not None:
        return refused
    before = None
    if call.action in ("ModifyDBInstance", "DeleteDBInstance"):
        before = await _describe_instance(call, headers, ident)
    if call.action == "ModifyDBInstance":
        refused = _storage_refusal(rds, call, key, params, before, now)
        if refused is not None:
            return refused
    answer = await call.forward(headers)
    now = call.clock()
    if answer.status == 404 and call.action == "DescribeDBInstances":
        listing = _deleting_listing(rds, key, now)
        if listing is not None:
            return xml_answer(answer, listing)
    if answer.status != 200:
        return plain(answer)
    _record(rds, call, key, params, before, now)
    if call.action not in RENDERED:
        return plain(answer)
    return xml_answer(answer, _render(rds, call, ident, answer.body, now))


async def _describe_instance(call: Call, headers: dict[str, str], ident: str) -> ET.Element | None:
    """The instance's DBInstance element as moto has it now; None when moto has none."""
    body = urllib.parse.urlencode(
        {
            "Action": "DescribeDBInstances",
            "Version": "2014-10-31",
            "DBInstanceIdentifier": ident,
        }
    ).encode()
    internal = {
        "Authorization": headers.get("Authorization", ""),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    answer = await call.upstream.send("POST", "/", internal, body)
    if answer.status != 200:
        return None
    return parse_xml(answer.body).find(f".//{rds_tag('DBInstance')}")


def _busy_refusal(
    rds: RdsModel, call: Call, key: tuple[str, str, str], params: dict[str, str], now: float
) -> web.Response | None:
    """AWS's refusal of a create while the identifier is being deleted, or of a modification
    while the instance is busy; None when AWS takes the call."""
    snapshot = (call.account, call.region, params.get("DBSnapshotIdentifier", ""))
    if call.action == "RestoreDBInstanceFromDBSnapshot" and rds.snapshot_creating(snapshot, now):
        return call.refuse(
            "rds",
            call.action,
            "query",
            400,
            "InvalidDBSnapshotState",
            f"Snapshot {snapshot[2]} is not in available state.",
        )
    if call.action in MAKERS and rds.phase(key, now) == "deleting":
        return call.refuse(
            "rds",
            call.action,
            "query",
            400,
            "DBInstanceAlreadyExists",
            "DB instance already exists",
        )
    if call.action in ("ModifyDBInstance", "RebootDBInstance", "PromoteReadReplica") and (
        rds.phase(key, now) in BUSY
    ):
        return call.refuse(
            "rds",
            call.action,
            "query",
            400,
            "InvalidDBInstanceState",
            f"Database instance {key[2]} is not in available state.",
        )
    return None


def _storage_refusal(
    rds: RdsModel,
    call: Call,
    key: tuple[str, str, str],
    params: dict[str, str],
    before: ET.Element | None,
    now: float,
) -> web.Response | None:
    """AWS's refusal of a storage change while the previous one is being optimized."""
    changes_storage = (
        before is not None
        and "AllocatedStorage" in params
        and current_value(before, "AllocatedStorage") != params["AllocatedStorage"]
    )
    if changes_storage and rds.storage_locked(key, now):
        return call.refuse(
            "rds",
            call.action,
            "query",
            400,
            "InvalidParameterCombination",
            "You cannot currently modify the storage of this DB instance because the "
            "previous storage change is being optimized.",
        )
    return None


def _deleting_listing(rds: RdsModel, key: tuple[str, str, str], now: float) -> ET.Element | None:
    """DescribeDBInstances' answer for an instance still `deleting` (which moto has already
    forgotten); None when it is not."""
    deleting = rds.deleting.get(key)
    if deleting is None or now >= deleting.until:
        return None
    root = ET.Element(rds_tag("DescribeDBInstancesResponse"))
    listing = ET.SubElement(
        ET.SubElement(root, rds_tag("DescribeDBInstancesResult")), rds_tag("DBInstances")
    )
    listing.append(parse_xml(deleting.element))
    meta = ET.SubElement(root, rds_tag("ResponseMetadata"))
    ET.SubElement(meta, rds_tag("RequestId")).text = request_id()
    return root


def _record(
    rds: RdsModel,
    call: Call,
    key: tuple[str, str, str],
    params: dict[str, str],
    before: ET.Element | None,
    now: float,
) -> None:
    """What a call moto took starts: a creation, a modification, a deletion, a snapshot."""
    if call.action in MAKERS:
        rds.created(key, now, MAKERS[call.action])
    elif call.action == "PromoteReadReplica":
        rds.promoting(key, now)
    elif call.action == "ModifyDBInstance" and before is not None:
        rds.modified(key, params, before, now)
        if "DBParameterGroupName" in params:
            rds.parameters.attached(key, now)
    elif call.action == "RebootDBInstance":
        rds.rebooted(key, now)
    elif call.action == "DeleteDBInstance" and before is not None:
        skip = params.get("SkipFinalSnapshot", "false").lower() == "true"
        snapshot = None if skip else params.get("FinalDBSnapshotIdentifier")
        rds.deleted(key, before, snapshot, now)
    elif call.action == "CreateDBSnapshot":
        rds.snapshot_started(
            (call.account, call.region, params.get("DBSnapshotIdentifier", "")), now
        )


def _render(rds: RdsModel, call: Call, ident: str, body: bytes, now: float) -> ET.Element:
    """moto's answer reshaped into what AWS shows now; a listing of every instance has those
    still `deleting` too."""
    root = parse_xml(body)
    for element in root.iter(rds_tag("DBInstance")):
        rds.render(element, call.account, call.region, now)
    for element in root.iter(rds_tag("DBSnapshot")):
        rds.render_snapshot(element, call.account, call.region, now)
    if call.action == "DescribeDBInstances" and not ident:
        instances = root.find(f".//{rds_tag('DBInstances')}")
        if instances is not None:
            for element in rds.deleting_elements(call.account, call.region, now):
                instances.append(element)
    return root
