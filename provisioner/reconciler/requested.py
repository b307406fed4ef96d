"""Requested changes: which spec fields the user changed since the spec last handled.

A field whose spec value changed since then is a requested change, applied in every case.
Any other difference between the cloud and the spec is drift, whatever pass finds it (a
resync, an annotation or label edit, a reconcile request, the resume after a restart):
corrected by default, only reported under `drift-policy: report`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.model import schema_defaults
from provisioner.model.classes import changed_fields
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Event


@dataclass(frozen=True)
class Requested:
    """Which spec fields the user changed since the spec last handled."""

    # Top-level spec paths ("spec.visibilityTimeoutSeconds"); `everything` for a new resource.
    paths: frozenset[str] = frozenset()
    everything: bool = False

    def covers(self, diff_field: str) -> bool:
        """Whether a FieldDiff's field ("spec.lifecycle.expireAfterDays", "tags") was asked for."""
        if self.everything:
            return True
        return _top(diff_field) in self.paths


NOTHING_REQUESTED = Requested()
EVERYTHING_REQUESTED = Requested(everything=True)


def _top(diff_field: str) -> str:
    return "spec.tags" if diff_field == "tags" else ".".join(diff_field.split(".")[:2])


def last_handled_spec(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spec kopf last handled successfully (its diff base in status.kopf), None if none;
    read as the API server would serve it now (schema_defaults.last_handled_at_hub)."""
    stored = ((body.get("status") or {}).get("kopf") or {}).get("lastHandledConfiguration")
    if not stored or not isinstance(stored, str):
        return None
    try:
        essence = json.loads(stored)
        spec = essence.get("spec") or {}
    except (ValueError, AttributeError):
        return None
    if not isinstance(spec, Mapping):
        return None
    meta = essence.get("metadata")
    record = {"spec": spec, **({"metadata": meta} if isinstance(meta, Mapping) else {})}
    hub = schema_defaults.last_handled_at_hub(record, str(body.get("kind") or ""))
    return dict(hub.get("spec") or {})


def requested_fields(
    last_handled: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Requested:
    """The spec fields that differ from the spec last handled (all of them when none was)."""
    if last_handled is None:
        return EVERYTHING_REQUESTED
    keys = set(last_handled) | set(current)
    return Requested(frozenset(f"spec.{k}" for k in keys if last_handled.get(k) != current.get(k)))


def planned(resource: Resource, requested: Requested) -> Requested:
    """After a plan, the changes it listed count as requested (the user saw and approved
    them), even where kopf already took the spec as handled while it was planned only."""
    plan = resource.status.get("plan") or {}
    if resource.plan_only or not plan.get("changes") or requested.everything:
        return requested
    fields = {str(c.get("field") or "") for c in plan["changes"]}
    tops = {_top(f) for f in fields if f}
    return Requested(requested.paths | frozenset(tops))


def by_class(resource: Resource, requested: Requested) -> Requested:
    """The fields whose value from the resource's ResourceClass changed since its last pass
    count as requested (a platform team's edit is applied under drift-policy report too);
    so do those of a class it no longer uses."""
    used = resource.status.get("class") or {}
    if requested.everything or not (used or resource.class_use):
        return requested
    if resource.class_use is not None:
        tops = changed_fields(used, resource.class_use)
    else:
        tops = frozenset(f"spec.{name}" for name in used.get("fields") or {})
    return Requested(requested.paths | tops) if tops else requested


def immutable_by_class(resource: Resource, requested: Requested) -> list[Event]:
    """A Warning for each immutable field whose value from the class changed, on a resource
    that exists already: it applies to new resources only."""
    use = resource.class_use
    if use is None or requested.everything or not resource.status.get("arn"):
        return []
    if (resource.status.get("class") or {}).get("name") != use.name:
        return []
    fixed = schema_defaults.immutable_fields(resource.kind)
    changed = sorted(
        top.removeprefix("spec.")
        for top in changed_fields(resource.status["class"], use)
        if top.removeprefix("spec.") in fixed
    )
    return [
        Event(
            "Warning",
            "ClassChangeNotApplied",
            f"spec.{name} from ResourceClass {use.name} changed; it cannot change on an "
            f"existing {resource.kind}: it applies to new ones",
        )
        for name in changed
    ]
