"""Which ResourceClass a resource uses, and the refusals that come before any cloud call.

A `ResourceClass` (cluster-scoped, created by platform admins, as CloudAccounts are) names a
kind, the namespaces that may use it (a label selector; an empty one selects none),
`defaults`, `enforced` fields and `tags` (provisioner/model/classes.py). A resource uses the
class its `spec.className` names, else the default class of its kind that selects its
namespace, else none. Refusals: `ClassNotFound`, `ClassNotAllowed` (the class does not
select the namespace), `AmbiguousClass` (two default classes select it) and `InvalidSpec`
(a class of another kind, or an enforced field set otherwise; the chart's admission policy
refuses that at `kubectl apply` already).

The directory lists every class once before it answers (a default class must never be
missed because the watch has not delivered it yet), then follows the watch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from provisioner.model import conditions as cond
from provisioner.model import conversion, spec_check
from provisioner.model.classes import (
    ClassRefused,
    ClassUse,
    ResourceClass,
    effective_spec,
    violations,
)
from provisioner.placement.accounts import selector_matches

KIND = "ResourceClass"
PLURAL = "resourceclasses"
VERSION = "v1beta1"


class Classes:
    """What the operator knows of ResourceClasses; thread-safe."""

    def __init__(
        self,
        list_classes: Callable[[], Sequence[Mapping[str, Any]] | None],
        namespace_labels: Callable[[str], Mapping[str, str]],
    ) -> None:
        # None from `list_classes`: the API server serves no ResourceClasses (no CRD).
        self._list = list_classes
        self._labels = namespace_labels
        self._lock = threading.Lock()
        self.classes: dict[str, ResourceClass] = {}
        self.listed = False
        # (name, generation) -> what is wrong with its defaults ("" when nothing).
        self._checked: dict[tuple[str, int], str] = {}

    # -- fed by the watch ---------------------------------------------------------------

    def class_seen(self, body: Mapping[str, Any]) -> tuple[ResourceClass | None, ResourceClass]:
        found = ResourceClass.from_body(body)
        with self._lock:
            before = self.classes.get(found.name)
            self.classes[found.name] = found
        return before, found

    def class_gone(self, name: str) -> ResourceClass | None:
        with self._lock:
            return self.classes.pop(name, None)

    def _ensure_listed(self) -> None:
        if self.listed:
            return
        bodies = self._list()
        with self._lock:
            for body in bodies or []:
                found = ResourceClass.from_body(body)
                self.classes.setdefault(found.name, found)
            self.listed = True

    # -- asked by the passes ------------------------------------------------------------

    def resolve(
        self, kind: str, namespace: str, named: str, used: str = ""
    ) -> ResourceClass | None:
        """The class a resource of `kind` in `namespace` uses: the one it names (`named`),
        else the default class of its kind that selects the namespace, else None.
        `used`: the class its last pass used (one being deleted stays usable for it)."""
        self._ensure_listed()
        with self._lock:
            known = list(self.classes.values())
        labels = self._labels(namespace)
        if named:
            cls = next((c for c in known if c.name == named), None)
            if cls is None or (cls.deleting and named != used):
                why = "is being deleted" if cls is not None else "does not exist"
                raise ClassRefused(cond.CLASS_NOT_FOUND, f"ResourceClass {named} {why}")
            if cls.kind != kind:
                raise ClassRefused(
                    cond.INVALID_SPEC,
                    f"spec.className: ResourceClass {named} is for {cls.kind}, not {kind}",
                )
            if not selector_matches(cls.selector, labels):
                raise ClassRefused(
                    cond.CLASS_NOT_ALLOWED,
                    f"ResourceClass {named} does not select namespace {namespace} "
                    "(its spec.namespaceSelector)",
                )
            return cls
        defaults = sorted(
            (
                c
                for c in known
                if c.kind == kind
                and c.default
                and selector_matches(c.selector, labels)
                and (not c.deleting or c.name == used)
            ),
            key=lambda c: c.name,
        )
        if len(defaults) > 1:
            raise ClassRefused(
                cond.AMBIGUOUS_CLASS,
                f"ResourceClasses {' and '.join(c.name for c in defaults)} are both the "
                f"default for {kind} in namespace {namespace}: name one in spec.className",
            )
        return defaults[0] if defaults else None

    def _problems(self, cls: ResourceClass) -> str:
        """What is wrong with the class's defaults ("" when nothing), once per generation."""
        key = (cls.name, cls.generation)
        known = self._checked.get(key)
        if known is None:
            known = "; ".join(spec_check.problems(cls.kind, cls.defaults) or [])
            with self._lock:
                self._checked = {k: v for k, v in self._checked.items() if k[0] != cls.name}
                self._checked[key] = known
        return known

    def apply(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], ClassUse | None]:
        """The body (at the hub version) with its effective spec, and the class it used
        (None: none applies). ClassRefused when it may not use one, or sets an enforced
        field otherwise."""
        hub = conversion.to_internal(body)
        meta, spec = hub["metadata"], dict(hub.get("spec") or {})
        kind = str(hub.get("kind") or body.get("kind") or "")
        used = str(((hub.get("status") or {}).get("class") or {}).get("name") or "")
        cls = self.resolve(kind, str(meta["namespace"]), str(spec.get("className") or ""), used)
        if cls is None:
            return dict(hub), None
        wrong = violations(kind, spec, cls)
        if wrong:
            raise ClassRefused(
                cond.INVALID_SPEC,
                "; ".join(f"spec.{name} is set by ResourceClass {cls.name}" for name in wrong),
            )
        invalid = self._problems(cls)
        if invalid:
            raise ClassRefused(
                cond.INVALID_SPEC, f"ResourceClass {cls.name} has invalid defaults: {invalid}"
            )
        effective, use = effective_spec(kind, spec, cls)
        return {**hub, "spec": effective}, use


def class_users(name: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Of `items` (custom resources), those that name the class `name` or used it last:
    "namespace/Kind/name", sorted."""
    found = []
    for item in items:
        spec, status = item.get("spec") or {}, item.get("status") or {}
        used = (status.get("class") or {}).get("name")
        if spec.get("className") == name or used == name:
            meta = item["metadata"]
            found.append(f"{meta['namespace']}/{item['kind']}/{meta['name']}")
    return sorted(found)
