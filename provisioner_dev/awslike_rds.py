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

import random
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from aiohttp import web

from provisioner_dev.awslike_durations import Durations
from provisioner_dev.awslike_http import (
    RDS_NS,
    Call,
    forwarded_headers,
    plain,
    request_id,
    xml_answer,
)
from provisioner_dev.awslike_rds_parameters import (
    ACTIONS,
    Parameters,
    handle_parameters,
    render_groups,
)
from provisioner_dev.cloudprofile import Profile


def _xml(data: str | bytes) -> ET.Element:
    """Parse XML that moto's server (on loopback) or this proxy wrote."""
    return ET.fromstring(data)  # noqa: S314 - our own upstream's answers, not foreign input


def _q(tag: str) -> str:
    return f"{{{RDS_NS}}}{tag}"


# ModifyDBInstance parameter -> (DescribeDBInstances element, PendingModifiedValues element).
MODIFIABLE = {
    "DBInstanceClass": ("DBInstanceClass", "DBInstanceClass"),
    "AllocatedStorage": ("AllocatedStorage", "AllocatedStorage"),
    "EngineVersion": ("EngineVersion", "EngineVersion"),
    "DBPortNumber": ("Port", "Port"),
    "MultiAZ": ("MultiAZ", "MultiAZ"),
    "BackupRetentionPeriod": ("BackupRetentionPeriod", "BackupRetentionPeriod"),
}
# ModifyDBInstance parameters AWS applies at once, shown `modifying` for a while all the same:
# DescribeDBInstances element (None: the security groups, listed).
IMMEDIATE = {
    "DeletionProtection": "DeletionProtection",
    "PreferredBackupWindow": "PreferredBackupWindow",
    "PreferredMaintenanceWindow": "PreferredMaintenanceWindow",
    "AutoMinorVersionUpgrade": "AutoMinorVersionUpgrade",
}
SECURITY_GROUPS = "VpcSecurityGroupIds.VpcSecurityGroupId."
BUSY = {"creating", "modifying", "resetting-master-credentials", "deleting", "rebooting"}
# The calls that make an instance, and the duration each plays.
MAKERS = {
    "CreateDBInstance": "rds.create",
    "RestoreDBInstanceFromDBSnapshot": "rds.restore",
    "RestoreDBInstanceToPointInTime": "rds.restore",
    "CreateDBInstanceReadReplica": "rds.replica",
}


def _current_value(element: ET.Element, tag: str) -> str | None:
    if tag == "Port":
        found = element.find(f"{_q('Endpoint')}/{_q('Port')}")
    else:
        found = element.find(_q(tag))
    return None if found is None else (found.text or "")


def _changes_at_once(params: dict[str, str], before: ET.Element) -> bool:
    """Whether the call changes a value AWS applies at once (deletion protection, windows,
    security groups)."""
    for param, tag in IMMEDIATE.items():
        was = _current_value(before, tag)
        if param in params and (was or "").lower() != params[param].lower():
            return True
    wanted = {v for k, v in params.items() if k.startswith(SECURITY_GROUPS)}
    if not wanted:
        return False
    shown = {e.text for e in before.iter(_q("VpcSecurityGroupId"))}
    return wanted != shown


def _set_value(element: ET.Element, tag: str, value: str) -> None:
    found = (
        element.find(f"{_q('Endpoint')}/{_q('Port')}") if tag == "Port" else element.find(_q(tag))
    )
    if found is not None:
        found.text = value


@dataclass
class Modification:
    until: float
    status: str
    old: dict[str, str]  # element -> value still shown as current
    pending: dict[str, str]  # PendingModifiedValues element -> new value


@dataclass
class DbInstance:
    create_done: float = 0.0
    backup_done: float = 0.0
    modification: Modification | None = None
    storage_optimized: float = 0.0
    storage_locked: float = 0.0


@dataclass
class DeletingDb:
    until: float
    element: str  # the instance's last DBInstance element, serialised


class RdsModel:
    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.instances: dict[tuple[str, str, str], DbInstance] = {}
        self.deleting: dict[tuple[str, str, str], DeletingDb] = {}
        self.snapshots: dict[tuple[str, str, str], tuple[float, float]] = {}
        self.promoted: set[tuple[str, str, str]] = set()
        self.durations = Durations(profile, rng)
        self.parameters = Parameters()

    def draw(self, name: str) -> float:
        return self.durations.draw(name)

    def phase(self, key: tuple[str, str, str], now: float) -> str:
        if key in self.deleting and now < self.deleting[key].until:
            return "deleting"
        db = self.instances.get(key)
        if db is None:
            return "available"
        if now < db.create_done:
            return "creating"
        if now < db.backup_done:
            return "backing-up"
        if db.modification is not None and now < db.modification.until:
            return db.modification.status
        if now < db.storage_optimized:
            return "storage-optimization"
        return "available"

    def created(self, key: tuple[str, str, str], now: float, duration: str = "rds.create") -> None:
        self.deleting.pop(key, None)
        self.promoted.discard(key)
        create_done = now + self.draw(duration)
        self.instances[key] = DbInstance(
            create_done=create_done, backup_done=create_done + self.draw("rds.backup")
        )
        self.parameters.booted(key, create_done)

    def rebooted(self, key: tuple[str, str, str], now: float) -> None:
        """`rebooting`, then `available` with static parameters applied."""
        until = now + self.draw("rds.reboot")
        db = self.instances.setdefault(key, DbInstance())
        db.modification = Modification(until=until, status="rebooting", old={}, pending={})
        self.parameters.booted(key, until)

    def promoting(self, key: tuple[str, str, str], now: float) -> None:
        db = self.instances.setdefault(key, DbInstance())
        until = now + self.draw("rds.promote")
        db.modification = Modification(until=until, status="modifying", old={}, pending={})
        self.promoted.add(key)

    def snapshot_creating(self, key: tuple[str, str, str], now: float) -> bool:
        return key in self.snapshots and now < self.snapshots[key][1]

    def storage_locked(self, key: tuple[str, str, str], now: float) -> bool:
        db = self.instances.get(key)
        return db is not None and now < db.storage_locked

    def modified(
        self, key: tuple[str, str, str], params: dict[str, str], before: ET.Element, now: float
    ) -> None:
        old, pending = {}, {}
        for param, (tag, pending_tag) in MODIFIABLE.items():
            if param not in params:
                continue
            was = _current_value(before, tag)
            if was is not None and was.lower() != params[param].lower():
                old[tag] = was
                pending[pending_tag] = params[param]
        password = "MasterUserPassword" in params
        if password:
            pending["MasterUserPassword"] = "****"
        # Secrets Manager taking the password or giving it back changes the instance
        # (`modifying`); a rotation of the password it keeps resets the credentials.
        switched = "ManageMasterUserPassword" in params
        rotated = params.get("RotateMasterUserPassword", "").lower() == "true"
        if not pending and not (switched or rotated or _changes_at_once(params, before)):
            return
        alone = not switched and ((password and len(pending) == 1) or (rotated and not pending))
        until = now + self.draw("rds.reset_password" if alone else "rds.modify")
        db = self.instances.setdefault(key, DbInstance())
        status = "resetting-master-credentials" if alone else "modifying"
        db.modification = Modification(until=until, status=status, old=old, pending=pending)
        if "AllocatedStorage" in old:
            db.storage_optimized = until + self.draw("rds.storage_optimization")
            db.storage_locked = max(now + self.draw("rds.storage_cooldown"), db.storage_optimized)

    def deleted(
        self, key: tuple[str, str, str], before: ET.Element, snapshot: str | None, now: float
    ) -> None:
        ready = now
        if snapshot:
            ready = now + self.draw("rds.snapshot")
            self.snapshots[(key[0], key[1], snapshot)] = (now, ready)
        self.instances.pop(key, None)
        status = before.find(_q("DBInstanceStatus"))
        if status is not None:
            status.text = "deleting"
        self.deleting[key] = DeletingDb(
            until=ready + self.draw("rds.delete"), element=ET.tostring(before, encoding="unicode")
        )

    def snapshot_started(self, key: tuple[str, str, str], now: float) -> None:
        self.snapshots[key] = (now, now + self.draw("rds.snapshot"))

    def render(self, element: ET.Element, account: str, region: str, now: float) -> None:
        """Reshape one DBInstance element of moto's into what AWS shows now."""
        ident = element.findtext(_q("DBInstanceIdentifier")) or ""
        self._unlist_promoted(element, account, region, now)
        status = element.find(_q("DBInstanceStatus"))
        if status is None or status.text != "available":
            return  # moto's own states (stopped, deleting) are shown as they are
        key = (account, region, ident)
        render_groups(self.parameters, element, account, region)
        phase = self.phase(key, now)
        status.text = phase
        if phase == "creating":
            endpoint = element.find(_q("Endpoint"))
            if endpoint is not None:
                element.remove(endpoint)  # AWS has no endpoint before the instance exists
        db = self.instances.get(key)
        if db is None or db.modification is None or phase != db.modification.status:
            return
        for tag, value in db.modification.old.items():
            _set_value(element, tag, value)
        pending = element.find(_q("PendingModifiedValues"))
        if pending is None:
            pending = ET.SubElement(element, _q("PendingModifiedValues"))
        for tag, value in db.modification.pending.items():
            ET.SubElement(pending, _q(tag)).text = value

    def _unlist_promoted(self, element: ET.Element, account: str, region: str, now: float) -> None:
        """A promoted instance names no source once promoted, nor does its source list it."""
        source = element.find(_q("ReadReplicaSourceDBInstanceIdentifier"))
        ident = element.findtext(_q("DBInstanceIdentifier")) or ""
        if source is not None and self._promoted((account, region, ident), now):
            element.remove(source)
        for listed in element.iter(_q("ReadReplicaDBInstanceIdentifiers")):
            for replica in list(listed):
                if self._promoted((account, region, replica.text or ""), now):
                    listed.remove(replica)

    def _promoted(self, key: tuple[str, str, str], now: float) -> bool:
        return key in self.promoted and self.phase(key, now) != "modifying"

    def deleting_elements(self, account: str, region: str, now: float) -> list[ET.Element]:
        return [
            _xml(d.element)
            for (acct, reg, _), d in sorted(self.deleting.items())
            if acct == account and reg == region and now < d.until
        ]

    def render_snapshot(self, element: ET.Element, account: str, region: str, now: float) -> None:
        ident = element.findtext(_q("DBSnapshotIdentifier")) or ""
        window = self.snapshots.get((account, region, ident))
        status = element.find(_q("Status"))
        if window is None or status is None or status.text != "available" or now >= window[1]:
            return
        status.text = "creating"
        started, ready = window
        progress = element.find(_q("PercentProgress"))
        if progress is None:
            progress = ET.SubElement(element, _q("PercentProgress"))
        progress.text = str(int(100 * (now - started) / max(ready - started, 1e-9)))


# ---------------------------------------------------------------------------------------------
# RDS's query API through the proxy.

# The actions whose answers show instances or snapshots, reshaped into what AWS shows now.
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
    return _xml(answer.body).find(f".//{_q('DBInstance')}")


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
        and _current_value(before, "AllocatedStorage") != params["AllocatedStorage"]
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
    root = ET.Element(_q("DescribeDBInstancesResponse"))
    listing = ET.SubElement(ET.SubElement(root, _q("DescribeDBInstancesResult")), _q("DBInstances"))
    listing.append(_xml(deleting.element))
    meta = ET.SubElement(root, _q("ResponseMetadata"))
    ET.SubElement(meta, _q("RequestId")).text = request_id()
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
    root = _xml(body)
    for element in root.iter(_q("DBInstance")):
        rds.render(element, call.account, call.region, now)
    for element in root.iter(_q("DBSnapshot")):
        rds.render_snapshot(element, call.account, call.region, now)
    if call.action == "DescribeDBInstances" and not ident:
        instances = root.find(f".//{_q('DBInstances')}")
        if instances is not None:
            for element in rds.deleting_elements(call.account, call.region, now):
                instances.append(element)
    return root
