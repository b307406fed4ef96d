"""Stage: classing. A resource's effective spec, completed from the ResourceClass that
applies to it (provisioner/placement/classes.py), before any other stage reads the spec;
a refusal is kept on the resource for its pass to report. Also which resources to look at
again when a class, or a namespace's labels, change."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from provisioner.model import conditions as cond
from provisioner.model.classes import ClassRefused, ResourceClass
from provisioner.model.resource import Resource
from provisioner.placement.classes import Classes
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers


class Classing:
    def __init__(
        self,
        classes: Classes | None,
        parse: Callable[[Mapping[str, Any]], Resource],
        workers: Workers,
        states: States,
    ) -> None:
        # ResourceClasses (None: served only with CloudAccounts, --accounts=on).
        self.classes = classes
        self.parse = parse
        self.workers = workers
        self.states = states

    async def classed(self, body: Mapping[str, Any]) -> Resource:
        """The resource with its effective spec: completed from its ResourceClass, if one
        applies; a refusal is kept for its pass."""
        resource = self.parse(body)
        named = str((body.get("spec") or {}).get("className") or "")
        classes = self.classes
        self.states.of(resource.uid).classed = (resource.kind, resource.namespace, named)
        if classes is None:
            if not named:
                return resource
            refused = ClassRefused(
                cond.CLASS_NOT_FOUND,
                f"ResourceClass {named}: this operator serves no ResourceClasses "
                "(started with --accounts=off)",
            )
            return dataclasses.replace(resource, class_refused=refused)
        if classes.listed and not classes.classes and not named:
            return resource  # no class at all: nothing to read
        try:
            effective, use = await self.workers.in_thread(classes.apply, body)
        except ClassRefused as exc:
            return dataclasses.replace(resource, class_refused=exc)
        if use is None:
            return resource
        return dataclasses.replace(self.parse(effective), class_use=use)

    def affected(
        self,
        before: ResourceClass | None,
        now: ResourceClass | None,
        namespace: str | None = None,
    ) -> list[str]:
        """The resources to look at again after a ResourceClass changed from `before` to
        `now` (those that name it, and those that name none where it is or was a default),
        or (`namespace`) after that namespace's labels changed."""
        changed = [c for c in (before, now) if c is not None]
        names = {c.name for c in changed}
        kinds_of = {c.kind for c in changed}
        default = any(c.default for c in changed)
        found = []
        for uid, state in self.states.items():
            if state.classed is None:
                continue
            kind, ns, named = state.classed
            if namespace is not None:
                if ns == namespace and self.classes is not None and self.classes.classes:
                    found.append(uid)
            elif kind in kinds_of and (named in names or (not named and default)):
                found.append(uid)
        return found
