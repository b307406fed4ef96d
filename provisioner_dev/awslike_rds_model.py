"""The RDS instances of the aws-like cloud as AWS would show them now: their phases
(`creating`, `backing-up`, `modifying`, `rebooting`, `deleting`, ...) and the values a
modification has yet to apply, kept beside what moto holds. provisioner_dev/awslike_rds.py
answers the calls with it."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from provisioner_dev.awslike_durations import Durations
from provisioner_dev.awslike_http import RDS_NS
from provisioner_dev.awslike_rds_parameters import Parameters, render_groups
from provisioner_dev.cloudprofile import Profile


def parse_xml(data: str | bytes) -> ET.Element:
    """Parse XML that moto's server (on loopback) or this proxy wrote."""
    return ET.fromstring(data)  # noqa: S314 - our own upstream's answers, not foreign input


def rds_tag(tag: str) -> str:
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


def current_value(element: ET.Element, tag: str) -> str | None:
    if tag == "Port":
        found = element.find(f"{rds_tag('Endpoint')}/{rds_tag('Port')}")
    else:
        found = element.find(rds_tag(tag))
    return None if found is None else (found.text or "")


def _changes_at_once(params: dict[str, str], before: ET.Element) -> bool:
    """Whether the call changes a value AWS applies at once (deletion protection, windows,
    security groups)."""
    for param, tag in IMMEDIATE.items():
        was = current_value(before, tag)
        if param in params and (was or "").lower() != params[param].lower():
            return True
    wanted = {v for k, v in params.items() if k.startswith(SECURITY_GROUPS)}
    if not wanted:
        return False
    shown = {e.text for e in before.iter(rds_tag("VpcSecurityGroupId"))}
    return wanted != shown


def _set_value(element: ET.Element, tag: str, value: str) -> None:
    found = (
        element.find(f"{rds_tag('Endpoint')}/{rds_tag('Port')}")
        if tag == "Port"
        else element.find(rds_tag(tag))
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
        """`rebooting`, then `available` with the static parameters of the reboot's start
        applied: one changed while it reboots waits for the next reboot."""
        until = now + self.draw("rds.reboot")
        db = self.instances.setdefault(key, DbInstance())
        db.modification = Modification(until=until, status="rebooting", old={}, pending={})
        self.parameters.booted(key, now)

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
            was = current_value(before, tag)
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
        status = before.find(rds_tag("DBInstanceStatus"))
        if status is not None:
            status.text = "deleting"
        self.deleting[key] = DeletingDb(
            until=ready + self.draw("rds.delete"), element=ET.tostring(before, encoding="unicode")
        )

    def snapshot_started(self, key: tuple[str, str, str], now: float) -> None:
        self.snapshots[key] = (now, now + self.draw("rds.snapshot"))

    def render(self, element: ET.Element, account: str, region: str, now: float) -> None:
        """Reshape one DBInstance element of moto's into what AWS shows now."""
        ident = element.findtext(rds_tag("DBInstanceIdentifier")) or ""
        self._unlist_promoted(element, account, region, now)
        status = element.find(rds_tag("DBInstanceStatus"))
        if status is None or status.text != "available":
            return  # moto's own states (stopped, deleting) are shown as they are
        key = (account, region, ident)
        render_groups(self.parameters, element, account, region)
        phase = self.phase(key, now)
        status.text = phase
        if phase == "creating":
            endpoint = element.find(rds_tag("Endpoint"))
            if endpoint is not None:
                element.remove(endpoint)  # AWS has no endpoint before the instance exists
        db = self.instances.get(key)
        if db is None or db.modification is None or phase != db.modification.status:
            return
        for tag, value in db.modification.old.items():
            _set_value(element, tag, value)
        pending = element.find(rds_tag("PendingModifiedValues"))
        if pending is None:
            pending = ET.SubElement(element, rds_tag("PendingModifiedValues"))
        for tag, value in db.modification.pending.items():
            ET.SubElement(pending, rds_tag(tag)).text = value

    def _unlist_promoted(self, element: ET.Element, account: str, region: str, now: float) -> None:
        """A promoted instance names no source once promoted, nor does its source list it."""
        source = element.find(rds_tag("ReadReplicaSourceDBInstanceIdentifier"))
        ident = element.findtext(rds_tag("DBInstanceIdentifier")) or ""
        if source is not None and self._promoted((account, region, ident), now):
            element.remove(source)
        for listed in element.iter(rds_tag("ReadReplicaDBInstanceIdentifiers")):
            for replica in list(listed):
                if self._promoted((account, region, replica.text or ""), now):
                    listed.remove(replica)

    def _promoted(self, key: tuple[str, str, str], now: float) -> bool:
        return key in self.promoted and self.phase(key, now) != "modifying"

    def deleting_elements(self, account: str, region: str, now: float) -> list[ET.Element]:
        return [
            parse_xml(d.element)
            for (acct, reg, _), d in sorted(self.deleting.items())
            if acct == account and reg == region and now < d.until
        ]

    def render_snapshot(self, element: ET.Element, account: str, region: str, now: float) -> None:
        ident = element.findtext(rds_tag("DBSnapshotIdentifier")) or ""
        window = self.snapshots.get((account, region, ident))
        status = element.find(rds_tag("Status"))
        if window is None or status is None or status.text != "available" or now >= window[1]:
            return
        status.text = "creating"
        started, ready = window
        progress = element.find(rds_tag("PercentProgress"))
        if progress is None:
            progress = ET.SubElement(element, rds_tag("PercentProgress"))
        progress.text = str(int(100 * (now - started) / max(ready - started, 1e-9)))


# ---------------------------------------------------------------------------------------------
# RDS's query API through the proxy.

# The actions whose answers show instances or snapshots, reshaped into what AWS shows now.
