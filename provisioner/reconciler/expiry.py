"""Stage: expiry (spec TTL). status.expiresAt and the condition Expiring, with a Warning
Event when it begins; the resource is deleted when its time comes (by the API server's
clock), and its finalizer honours its deletionPolicy."""

from __future__ import annotations

from provisioner.config import Settings
from provisioner.kube.client import Kube
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Event, Result, stamp


class Expiry:
    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings

    def report(self, resource: Resource, result: Result) -> None:
        """status.expiresAt and Expiring on the pass's Result."""
        expires = resource.expires_at
        had = cond.find(resource.status.get("conditions"), cond.EXPIRING)
        if expires is None:
            result.fields["expiresAt"] = None
            if had is not None and had.get("status") == "True":
                result.conditions.append(
                    cond.Condition(cond.EXPIRING, False, cond.EXPIRY_SCHEDULED, "no expiry")
                )
            return
        at = stamp(expires)
        result.fields["expiresAt"] = at
        left = (expires - self.kube.server_now()).total_seconds()
        if left > self.warning_seconds(resource):
            result.conditions.append(
                cond.Condition(cond.EXPIRING, False, cond.EXPIRY_SCHEDULED, f"deleted at {at}")
            )
            return
        message = (
            f"deleted at {at} (in {max(0, round(left))} s); "
            f"deletionPolicy {resource.deletion_policy}"
        )
        soon = cond.Condition(cond.EXPIRING, True, cond.EXPIRES_SOON, message)
        result.conditions.append(soon)
        if had is None or had.get("status") != "True":
            result.events.append(Event("Warning", "Expiring", message))

    def warning_seconds(self, resource: Resource) -> float:
        """How long before its expiry a resource says so: the configured time, or half its
        lifetime when that is shorter."""
        configured = self.settings.expiry_warning_seconds
        if resource.expires_at is None or resource.created_at is None:
            return configured
        lifetime = (resource.expires_at - resource.created_at).total_seconds()
        return max(0.0, min(configured, lifetime / 2))

    def due(self, resource: Resource) -> bool:
        return resource.expires_at is not None and resource.expires_at <= self.kube.server_now()

    @staticmethod
    def expired(resource: Resource) -> Event:
        at = stamp(resource.expires_at) if resource.expires_at else ""
        return Event(
            "Normal",
            "Expired",
            f"expired at {at}: deleted, deletionPolicy {resource.deletion_policy}",
        )
