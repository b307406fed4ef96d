"""Ready and Synced conditions, and the status patch that changes only what changed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
SYNCED = "Synced"
DRIFTED = "Drifted"
EXPIRING = "Expiring"

# Ready reasons
AVAILABLE = "Available"
CREATING = "Creating"
DELETING = "Deleting"
UNAVAILABLE = "Unavailable"
WAITING_FOR_DEPENDENCY = "WaitingForDependency"
# Synced reasons
RECONCILE_SUCCESS = "ReconcileSuccess"
RECONCILE_ERROR = "ReconcileError"
INVALID_SPEC = "InvalidSpec"
NAME_CONFLICT = "NameConflict"
PAUSED = "Paused"
# A deletion held by spec.deletionProtection (DatabaseInstance).
DELETION_PROTECTED = "DeletionProtected"
# plan-only annotation: observed, status.plan written, nothing applied
PLAN_ONLY = "PlanOnly"
# Expiring reasons (spec.ttl, spec.expiresAt)
EXPIRY_SCHEDULED = "Scheduled"
EXPIRES_SOON = "ExpiresSoon"
# Synced reasons of the account a resource lives in (no cloud call in any account)
ACCOUNT_NOT_FOUND = "AccountNotFound"
ACCOUNT_NOT_ALLOWED = "AccountNotAllowed"
REGION_NOT_ALLOWED = "RegionNotAllowed"
ACCOUNT_UNAVAILABLE = "AccountUnavailable"
ACCOUNT_REASONS = (ACCOUNT_NOT_FOUND, ACCOUNT_NOT_ALLOWED, REGION_NOT_ALLOWED, ACCOUNT_UNAVAILABLE)
# Synced reasons of the ResourceClass a resource uses (no cloud call either)
CLASS_NOT_FOUND = "ClassNotFound"
CLASS_NOT_ALLOWED = "ClassNotAllowed"
AMBIGUOUS_CLASS = "AmbiguousClass"
CLASS_REASONS = (CLASS_NOT_FOUND, CLASS_NOT_ALLOWED, AMBIGUOUS_CLASS)
# A Synced=False of the current generation with one of these: refused until the spec changes
# (read back from status after a restart).
REFUSED_FOR_GENERATION = (INVALID_SPEC, NAME_CONFLICT)
# Synced reasons of spec.access (the resource itself may be Ready)
ACCESS_CONFLICT = "AccessConflict"
ACCESS_DISABLED = "AccessDisabled"
ACCESS_NOT_SUPPORTED = "AccessNotSupported"
SERVICE_ACCOUNT_NOT_FOUND = "ServiceAccountNotFound"
OIDC_PROVIDER_NOT_FOUND = "OIDCProviderNotFound"
# What a grant is on is not there yet (a database's master user secret while RDS makes it).
ACCESS_PENDING = "AccessPending"
ACCESS_REASONS = (
    ACCESS_CONFLICT,
    ACCESS_DISABLED,
    ACCESS_NOT_SUPPORTED,
    SERVICE_ACCOUNT_NOT_FOUND,
    OIDC_PROVIDER_NOT_FOUND,
    ACCESS_PENDING,
)
# Drifted reasons
DRIFT_REPORTED = "DriftReported"
DRIFT_CORRECTED = "DriftCorrected"
NO_DRIFT = "NoDrift"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""

    def key(self) -> tuple[str, bool, str, str]:
        return (self.type, self.status, self.reason, self.message)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    for cond in conditions or []:
        if cond.get("type") == type_:
            return cond
    return None


def merge(
    current: list[dict[str, Any]] | None, updates: list[Condition], generation: int
) -> list[dict[str, Any]]:
    """The new conditions list; lastTransitionTime moves only when the status flips."""
    result = [dict(c) for c in current or []]
    for update in updates:
        status = "True" if update.status else "False"
        existing = find(result, update.type)
        entry = {
            "type": update.type,
            "status": status,
            "reason": update.reason,
            "message": update.message,
            "observedGeneration": generation,
            "lastTransitionTime": now(),
        }
        if existing is None:
            result.append(entry)
            continue
        if existing.get("status") == status:
            entry["lastTransitionTime"] = (
                existing.get("lastTransitionTime") or entry["lastTransitionTime"]
            )
        existing.clear()
        existing.update(entry)
    order = {READY: 0, SYNCED: 1, DRIFTED: 2}
    result.sort(key=lambda c: (order.get(c.get("type", ""), 9), c.get("type", "")))
    return result


def is_true(status: dict[str, Any], type_: str) -> bool:
    found = find(status.get("conditions"), type_)
    return bool(found and found.get("status") == "True")


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    if a is None:
        return False
    keys = ("status", "reason", "message", "observedGeneration")
    return all(a.get(k) == b.get(k) for k in keys)


def status_patch(
    current_status: dict[str, Any],
    updates: list[Condition],
    generation: int | None,
    fields: dict[str, Any],
) -> dict[str, Any]:
    """A merge patch for status with only what differs; {} when nothing does."""
    patch: dict[str, Any] = {}
    current_conditions = current_status.get("conditions") or []
    if updates:
        gen = (
            generation
            if generation is not None
            else int(current_status.get("observedGeneration") or 0)
        )
        merged = merge(current_conditions, updates, gen)
        if len(merged) != len(current_conditions) or not all(
            _same(find(current_conditions, c["type"]), c) for c in merged
        ):
            patch["conditions"] = merged
    if generation is not None and current_status.get("observedGeneration") != generation:
        patch["observedGeneration"] = generation
    for key, value in fields.items():
        if current_status.get(key) != value:
            patch[key] = value
    return patch


def changed(current_status: dict[str, Any], condition: Condition) -> bool:
    """Whether this condition's (status, reason, message) differs from what status shows."""
    existing = find(current_status.get("conditions"), condition.type)
    if existing is None:
        return True
    status = "True" if condition.status else "False"
    return (existing.get("status"), existing.get("reason"), existing.get("message")) != (
        status,
        condition.reason,
        condition.message,
    )
