"""The ResourceClass controller.

- ResourceClasses -> watched into the class directory; a change rechecks the resources it
                     may complete (paced like every recheck, by the call budget)
- with `manages_accounts` (the replica that keeps CloudAccounts) -> status: Ready when the
                     defaults pass the kind's schema (provisioner/model/spec_check.py),
                     inUse; a finalizer held while resources use it

The finalizer is the controller's own (`cloud.provisioner.dev/class-in-use`), not kopf's:
kopf takes its finalizer off any object of a kind it watches without a deletion handler, so
a replica that only watches classes (a namespaced one) would take off the keeper's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from provisioner import GROUP
from provisioner.kube.client import Kube
from provisioner.kube.inventory import custom_resources
from provisioner.model import conditions as cond
from provisioner.model import spec_check
from provisioner.model.classes import ResourceClass
from provisioner.placement import classes
from provisioner.placement.accounts import Directory
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Event
from provisioner.runtime.kopf_setup import plain
from provisioner.runtime.resync import ResyncScheduler

log = logging.getLogger(__name__)

CLASS_WATCH = "resourceclass-watch"
IN_USE_FINALIZER = f"{GROUP}/class-in-use"
API = f"/apis/{GROUP}/{classes.VERSION}/{classes.PLURAL}"
# A namespace every cluster has, for the dry run that checks a class's defaults.
DRY_RUN_NAMESPACE = "default"
# What a dry run needs that a class may leave to its resources (their required fields).
REQUIRED = {"DatabaseInstance": {"engine": "postgres", "instanceClass": "db.t3.micro"}}


def class_directory(kube: Kube, directory: Directory) -> classes.Classes:
    def listing() -> list[dict[str, Any]] | None:
        found = kube.request("GET", API)
        return None if found is None else list(found.get("items") or [])

    return classes.Classes(listing, lambda name: directory.namespace(name).labels)


@dataclass
class ClassesController:
    reconciler: Reconciler
    directory: classes.Classes
    scheduler: ResyncScheduler
    manage: bool
    # Class name -> what its status says as last written (so that the watch events of that
    # write ask for nothing more), and the deletions waiting for their users.
    reported: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    releasing: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def on_class_event(self, type: str | None, body: Any, **_: Any) -> None:
        raw = plain(body)
        name = str(raw["metadata"]["name"])
        if type == "DELETED":
            before, now = self.directory.class_gone(name), None
            self.reported.pop(name, None)
        else:
            before, now = self.directory.class_seen(raw)
        if before != now:
            affected = self.reconciler.class_affected(before, now)
            if affected:
                log.info("ResourceClass %s changed: rechecking %d resources", name, len(affected))
                self.scheduler.recheck(affected)
        if not self.manage or now is None:
            return
        finalizers = list(raw["metadata"].get("finalizers") or [])
        if now.deleting:
            if IN_USE_FINALIZER in finalizers and name not in self.releasing:
                task = asyncio.create_task(self.release(raw))
                self.releasing[name] = task
                task.add_done_callback(lambda _: self.releasing.pop(name, None))
            return
        try:
            if IN_USE_FINALIZER not in finalizers:
                await self.patch(raw, {"metadata": {"finalizers": [*finalizers, IN_USE_FINALIZER]}})
            await self.report(raw, now)
        except Exception as exc:  # noqa: BLE001 - its next watch event tries again
            log.warning("keeping ResourceClass %s failed: %s", name, exc)

    async def patch(self, raw: dict[str, Any], patch: dict[str, Any], sub: str = "") -> None:
        """A merge patch, of the version read (a finalizer list is replaced whole: another
        writer's change in between makes it fail, and its watch event brings it again)."""
        meta = raw["metadata"]
        if "metadata" in patch:
            patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
        await self.reconciler.in_thread(
            self.reconciler.kube.request,
            "PATCH",
            f"{API}/{meta['name']}{sub}",
            patch,
            content_type="application/merge-patch+json",
        )

    async def report(self, raw: dict[str, Any], cls: ResourceClass) -> None:
        """status: Ready (the defaults are a valid spec of the kind), inUse."""
        items = await self.reconciler.in_thread(custom_resources, self.reconciler.kube)
        found = spec_check.problems(cls.kind, cls.defaults)
        problem = "; ".join(found or [])
        if found is None:
            ready = cond.Condition(
                cond.READY, True, "Unchecked", "the kind's schema is unread: defaults unchecked"
            )
        elif problem:
            ready = cond.Condition(cond.READY, False, cond.INVALID_SPEC, problem)
        else:
            ready = cond.Condition(cond.READY, True, "Valid", f"valid defaults for {cls.kind}")
        in_use = len(classes.class_users(cls.name, items))
        said = (cls.generation, ready.status, ready.reason, ready.message, in_use)
        if self.reported.get(cls.name) == said:
            return
        status = raw.get("status") or {}
        update = cond.status_patch(status, [ready], cls.generation, {"inUse": in_use})
        if update:
            await self.patch(raw, {"status": update}, "/status")
        self.reported[cls.name] = said
        if problem and cond.changed(status, ready):
            self.reconciler.post_event(
                raw | {"kind": classes.KIND}, Event("Warning", cond.INVALID_SPEC, ready.message)
            )

    async def release(self, raw: dict[str, Any]) -> None:
        """Deleting a ResourceClass waits until no resource names it or used it last; an
        InUse Event says which, whenever that changes."""
        name = str(raw["metadata"]["name"])
        kube = self.reconciler.kube
        said, attempt = "", 0
        while True:
            try:
                current = await self.reconciler.in_thread(kube.request, "GET", f"{API}/{name}")
                finalizers = list(((current or {}).get("metadata") or {}).get("finalizers") or [])
                if current is None or IN_USE_FINALIZER not in finalizers:
                    return
                items = await self.reconciler.in_thread(custom_resources, kube)
                users = classes.class_users(name, items)
                if not users:
                    kept = [f for f in finalizers if f != IN_USE_FINALIZER]
                    await self.patch(current, {"metadata": {"finalizers": kept}})
                    return
                more = f" and {len(users) - 10} more" if len(users) > 10 else ""
                message = (
                    f"deletion waits: {len(users)} resources use ResourceClass {name}: "
                    + ", ".join(users[:10])
                    + more
                )
                if message != said:
                    self.reconciler.post_event(
                        current | {"kind": classes.KIND}, Event("Warning", "InUse", message)
                    )
                    said = message
            except Exception as exc:  # noqa: BLE001 - tried again below
                log.warning("releasing ResourceClass %s failed: %s", name, exc)
            attempt += 1
            await asyncio.sleep(min(30.0, 2.0 * attempt))


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    scheduler: ResyncScheduler,
    manage: bool,
) -> None:
    """Wire the ResourceClass controller into `registry` (the reconciler has classes)."""
    assert reconciler.classes is not None
    controller = ClassesController(reconciler, reconciler.classes, scheduler, manage)
    kopf.on.event(GROUP, classes.VERSION, classes.PLURAL, id=CLASS_WATCH, registry=registry)(
        controller.on_class_event
    )
