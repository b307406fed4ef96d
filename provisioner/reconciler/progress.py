"""One pass over one resource as it goes forward through the stages: what it acts on, and
what it has done so far. What it did is kept when a later stage fails (a Created or a
PasswordChanged before a Secret conflict still happened)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provisioner.kinds.contract import KindDescriptor
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Event
from provisioner.reconciler.requested import Requested


@dataclass
class Progress:
    resource: Resource
    # What the pass needs to know of the resource's kind (its contract).
    kind: KindDescriptor
    retry: int
    requested: Requested
    # A periodic look (its observation may come from a batched describe).
    resync: bool = False
    events: list[Event] = field(default_factory=list)
    # Conditions besides Ready and Synced (Drifted).
    conditions: list[cond.Condition] = field(default_factory=list)
    # Status fields the pass writes.
    fields: dict[str, Any] = field(default_factory=dict)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))
