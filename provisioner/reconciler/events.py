"""Stage: events. A pass's own Events plus one per state change of a condition; a change in
the cloud names who asked for it where that is known for sure."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from provisioner.config import Settings
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Event, Result, event_reference

log = logging.getLogger(__name__)

# The Events of a change in the cloud (or of the resource's end): they name who asked.
CLOUD_CHANGES = frozenset(
    {
        "Created",
        "Updated",
        "Deleted",
        "Retained",
        "Adopted",
        "Drifted",
        "Vanished",
        "PasswordChanged",
        "AccessGranted",
        "AccessRevoked",
        "Expired",
    }
)
# Conditions whose False is expected on the way (Normal, not Warning).
QUIET_REASONS = frozenset(
    {cond.CREATING, cond.DELETING, cond.WAITING_FOR_DEPENDENCY, cond.PLAN_ONLY}
)


class Events:
    def __init__(
        self, settings: Settings, post_event: Callable[[dict[str, Any], Event], None]
    ) -> None:
        self.settings = settings
        self.post_event = post_event

    def emit(self, body: dict[str, Any], resource: Resource, result: Result) -> None:
        """Post the Result's own Events plus one per state change of a condition.

        Synced=True is news only when it recovers from False; Ready is news when its
        status or reason changes (not its wording alone: "available" while a change is
        pending, then "available; Secret written", is one state).
        """
        reference = event_reference(body)
        for event in result.events:
            if event.reason in CLOUD_CHANGES:
                event = self.attributed(resource, event)
            self.post_event(reference, event)
        for c in result.conditions:
            if not _news(resource, c):
                continue
            quiet = c.status or c.reason in QUIET_REASONS
            self.post_event(
                reference, Event("Normal" if quiet else "Warning", c.reason, c.message or c.reason)
            )

    def attributed(self, resource: Resource, event: Event) -> Event:
        """A cloud change's Event names who asked for the resource, and is logged (JSON logs
        carry `requested_by`, `resource_kind`, `resource_namespace`, `resource_name` and
        `event_reason` as fields). Only where an admission policy lets nobody but the
        creating user set the annotation (`--requested-by=verified`): elsewhere it is
        anyone's claim, and the requester is named nowhere."""
        who = resource.requested_by if self.settings.requester_verified else ""
        message = f"{event.message} (requested by {who})" if who else event.message
        log.info(
            "%s %s: %s",
            resource.ref,
            event.reason,
            message,
            extra={
                "requested_by": who,
                "resource_kind": resource.kind,
                "resource_namespace": resource.namespace,
                "resource_name": resource.name,
                "event_reason": event.reason,
            },
        )
        return Event(event.type, event.reason, message)


def _news(resource: Resource, c: cond.Condition) -> bool:
    """Whether a condition of the pass is a state change worth an Event."""
    if c.type not in (cond.READY, cond.SYNCED) or not cond.changed(resource.status, c):
        return False
    previous = cond.find(resource.status.get("conditions"), c.type)
    if c.type == cond.SYNCED and c.status and (previous is None or previous["status"] == "True"):
        return False
    return not (
        c.type == cond.READY
        and previous is not None
        and previous.get("status") == ("True" if c.status else "False")
        and previous.get("reason") == c.reason
    )


def status_patch(resource: Resource, result: Result) -> dict[str, Any]:
    """The one status patch of a pass (nothing when nothing changed)."""
    return cond.status_patch(
        resource.status,
        result.conditions,
        resource.generation if result.for_generation else None,
        result.fields,
    )
