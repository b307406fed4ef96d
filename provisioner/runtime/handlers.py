"""kopf's handlers, the same set for every kind, and their registration.

- create / update / resume -> Reconciler.reconcile (status merged into kopf's own patch);
                             a resume of a resource at rest only schedules its resync
- delete                   -> Reconciler.finalize (kopf holds our finalizer until it returns)
- one resync loop          -> Reconciler.resync of each resource every `resync_seconds`
- sharded, a drain label   -> the resource handed over to another replica
- CloudAccounts, Namespaces -> the CloudAccount controller (runtime/accounts_controller.py)
- ResourceClasses           -> the ResourceClass controller (runtime/classes_controller.py)

`Handlers` holds what the handlers act with, made once by `build`; `register` only wires
its methods (and the CloudAccount controller's) into kopf's registry.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import kopf

from provisioner import GROUP, VERSION, tracing
from provisioner.aws.budget import CallBudget
from provisioner.aws.session import Aws
from provisioner.config import Settings
from provisioner.kinds.registry import KINDS
from provisioner.kube import login as kubelogin
from provisioner.kube.client import KubeError
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Result, traced_outcome
from provisioner.runtime import accounts_controller, classes_controller, metrics, sharding
from provisioner.runtime.accounts_controller import ACCOUNT_WATCH, NAMESPACE_WATCH
from provisioner.runtime.kopf_setup import bounded_session, configure_kopf, plain, wait_for_api
from provisioner.runtime.resync import ResyncScheduler

log = logging.getLogger(__name__)

# kopf's ids of the handlers, as its log lines name them.
RECONCILE, FINALIZE, HANDOVER = "reconcile", "finalize", "handover"
STARTUP, CLEANUP, LOGIN = "startup", "cleanup", "login"


def _outcome(result: Result) -> str:
    """The `result` label of provisioner_reconcile_total, from the pass's verdict."""
    if result.release_finalizer:
        return "deleted"
    return result.verdict.metric_label(result.requeue_after is not None)


def _account(resource: Resource) -> str:
    """The CloudAccount a resource lives in, for the metrics ("": the operator's own)."""
    if resource.account is not None:
        return resource.account.name
    return resource.spec_account or str(resource.status.get("account") or "")


def _measure(body: dict[str, Any], resource: Resource, result: Result, started: float) -> None:
    """Metrics for one pass: count, duration, time to Ready/deletion, conditions."""
    kind = resource.kind
    metrics.RECONCILES.labels(kind, _outcome(result)).inc()
    metrics.DURATION.labels(kind).observe(time.monotonic() - started)
    meta = body.get("metadata", {})
    if result.release_finalizer:
        elapsed = metrics.seconds_since(meta.get("deletionTimestamp"))
        if elapsed is not None:
            metrics.TIME_TO_DELETE.labels(kind).observe(elapsed)
        metrics.CONDITIONS.forget(resource.uid)
        return
    ready = next((c for c in result.conditions if c.type == cond.READY), None)
    if ready is not None and ready.status and not cond.is_true(resource.status, cond.READY):
        if not resource.status.get("connectionSecret"):  # the first time only
            elapsed = metrics.seconds_since(meta.get("creationTimestamp"))
            if elapsed is not None:
                metrics.TIME_TO_READY.labels(kind).observe(elapsed)
    merged = cond.merge(resource.status.get("conditions"), result.conditions, resource.generation)
    metrics.CONDITIONS.record(
        resource.uid, metrics.recorded(kind, merged, meta, _account(resource))
    )


def _report(
    reconciler: Reconciler,
    body: dict[str, Any],
    outcome: tuple[Result, Resource],
    started: float,
) -> dict[str, Any]:
    """Events and metrics of one pass; returns its status patch ({} when nothing changed)."""
    result, resource = outcome
    if tracing.enabled():
        tracing.set_attributes(traced_outcome(result))
    reconciler.emit(body, resource, result)
    _measure(body, resource, result, started)
    return reconciler.status_patch(resource, result)


def _handed_to_kopf(resource: Resource, status: dict[str, Any], patch: kopf.Patch) -> None:
    """A change pass's status goes into kopf's own patch, which kopf writes to the API server
    as soon as the handler returns: its span in the pass's trace says what it holds."""
    plural = next(k.plural for k in KINDS if k.kind == resource.kind)
    attributes = {
        "http.request.method": "PATCH",
        "k8s.api.resource": f"{plural}/status",
        "provisioner.status.written_by": "kopf",
        "provisioner.status.fields": sorted(status),
    }
    with tracing.span(f"k8s PATCH {plural}/status", attributes):
        patch.setdefault("status", {}).update(status)


async def _cloud_calls_done(reconciler: Reconciler, timeout: float) -> bool:
    """Wait (at most `timeout` seconds) until no cloud call runs on the reconciler's threads;
    no new one starts after this."""

    def drain() -> None:
        for executor in (reconciler.executor, reconciler.look_executor):
            executor.shutdown(wait=True, cancel_futures=True)

    try:
        await asyncio.wait_for(asyncio.to_thread(drain), timeout)
    except TimeoutError:
        return False
    return True


async def report_resync(
    reconciler: Reconciler,
    body: Mapping[str, Any],
    outcome: tuple[Result, Resource],
    started: float,
) -> None:
    """Report one resync pass: Events, metrics, the status patch (inside its lock)."""
    raw = dict(body)
    resource = outcome[1]
    if status := _report(reconciler, raw, outcome, started):
        await reconciler.in_thread(
            reconciler.kube.patch_status,
            resource.kind,
            resource.namespace,
            resource.name,
            status,
        )


def owned(shard: str, body: Mapping[str, Any]) -> bool:
    """Whether `body` is shard `shard`'s to act on (not handed over, nor being drained)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    return sharding.owns(labels, shard)


def _share_budget(budget: CallBudget, members: int) -> None:
    budget.set_share(1 / members)


@dataclass(frozen=True)
class Handlers:
    """The handlers of every kind and of the operator's start and stop, with what they act
    with. `shards`: this replica's part of the ring (sharded only); `priority`: its peering
    priority (under peering only)."""

    settings: Settings
    reconciler: Reconciler
    scheduler: ResyncScheduler
    shards: sharding.Shards | None = None
    priority: int | None = None

    def handed_over(self, body: Any) -> bool:
        """A resource being drained (or no longer this replica's) is left alone."""
        if self.shards is None:
            return False
        return not owned(self.settings.shard_name, body)

    async def startup(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, self.reconciler.settings, self.priority)
        await wait_for_api(self.reconciler)
        if self.shards is not None:
            await self.shards.wait_member()
            self.shards.start()
        self.scheduler.start()

    async def cleanup(self, **_: Any) -> None:
        await self.scheduler.stop()
        if self.shards is not None:
            # kopf's handlers are done by now; a cancelled resync may still have a cloud call
            # on a thread. Leave the ring at once only when none has.
            await self.shards.stop(leave=await _cloud_calls_done(self.reconciler, 10.0))

    async def login(self, **_: Any) -> kopf.AiohttpSession:
        creds = await asyncio.to_thread(kubelogin.login)
        return bounded_session(creds, self.settings)

    async def on_change(
        self, body: Any, old: Any, patch: kopf.Patch, retry: int, reason: Any = None, **_: Any
    ) -> None:
        if self.handed_over(body):
            # Left pending for the new owner. kopf records when to try again in status.kopf
            # and the new owner keeps to it: a short delay, so that it does not wait.
            raise kopf.TemporaryError("handed over to another replica", delay=1)
        raw, started = plain(body), time.monotonic()
        if reason == kopf.Reason.RESUME and retry == 0 and self.scheduler.calm_resume:
            # A restart: a resource at rest waits for its resync, spread over one period.
            # A changed spec or annotation is an update, a deletion a delete: handled now.
            if self._left_at_rest(raw):
                return
        # kopf's `old` is the last successfully handled state (None for a new resource): the
        # spec fields that differ from it are the user's requested changes; anything else
        # the cloud differs in is drift.
        last_spec = plain((old or {}).get("spec") or {}) if old is not None else None
        trigger = str(getattr(reason, "value", reason) or "change")
        with tracing.pass_span(trigger, raw, retry=retry):
            result, resource = outcome = await self.reconciler.reconcile(raw, retry, last_spec)
            self.scheduler.track(resource)
            if status := _report(self.reconciler, raw, outcome, started):
                _handed_to_kopf(resource, status, patch)
        if result.requeue_after is not None:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after)

    def _left_at_rest(self, raw: dict[str, Any]) -> bool:
        """A resumed resource at rest: handed to the resync, its conditions recorded."""
        resource = self.reconciler.resource(raw)
        if not self.reconciler.at_rest(resource, raw):
            return False
        delay = self.scheduler.track_resumed(self.reconciler.known_placement(resource))
        metrics.CONDITIONS.record(
            resource.uid,
            metrics.recorded(
                resource.kind,
                resource.status.get("conditions") or [],
                raw.get("metadata") or {},
                _account(resource),
            ),
        )
        log.debug("%s at rest: next observed in %.0fs", resource.ref, delay)
        return True

    async def on_delete(self, body: Any, patch: kopf.Patch, retry: int, **_: Any) -> None:
        if self.handed_over(body):
            raise kopf.TemporaryError("handed over to another replica", delay=1)
        raw, started = plain(body), time.monotonic()
        with tracing.pass_span("delete", raw, retry=retry):
            result, resource = outcome = await self.reconciler.finalize(raw, retry)
            if status := _report(self.reconciler, raw, outcome, started):
                _handed_to_kopf(resource, status, patch)
        if not result.release_finalizer:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after or 5.0)
        self.scheduler.untrack(resource.uid)

    async def on_drain(self, type: str | None, body: Any, **_: Any) -> None:
        """The sharder moves this resource to another replica: once no pass of it is in
        flight (its lock) and its resync is forgotten, give it up (both labels removed)."""
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if self.shards is None or type == "DELETED" or sharding.DRAIN_LABEL not in labels:
            return
        if labels.get(sharding.SHARD_LABEL) != self.settings.shard_name:
            return
        uid, kind = str(meta["uid"]), str(body.get("kind", ""))
        await self._release(self.shards, uid, kind, meta["namespace"], meta["name"])
        self.reconciler.forget(uid)
        metrics.CONDITIONS.forget(uid)
        log.info("%s %s/%s handed over to another replica", kind, meta["namespace"], meta["name"])

    async def _release(
        self, shards: sharding.Shards, uid: str, kind: str, namespace: str, name: str
    ) -> None:
        """Remove the resource's shard labels inside its lock, trying until done (or it is
        gone, or no longer the same object)."""
        loop, delay = asyncio.get_running_loop(), 0.5
        plural = next(k.plural for k in KINDS if k.kind == kind)
        while True:
            async with self.reconciler.lock(uid):
                self.scheduler.untrack(uid)
                try:
                    await loop.run_in_executor(
                        shards.executor, shards.release, plural, namespace, name, uid
                    )
                    return
                except KubeError as exc:
                    if exc.status in (404, 409):
                        return  # gone, or not the same object any more
                    log.warning("handing over %s %s/%s: %s", kind, namespace, name, exc)
                except Exception as exc:  # noqa: BLE001 - tried again below
                    log.warning("handing over %s %s/%s: %s", kind, namespace, name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


def build(reconciler: Reconciler, settings: Settings, aws: Aws | None = None) -> Handlers:
    """The handlers with what they act with: the peering priority, this replica's shards,
    the resync loop."""
    # Peers of equal priority all pause (kopf), so each replica draws its own once.
    priority = None
    if settings.peering:
        priority = settings.peering_priority
        if priority is None:
            priority = random.randint(1, 2**30)
    shards = None
    if settings.sharding:
        shards = sharding.Shards(
            reconciler.kube,
            settings.namespace or reconciler.kube.creds.namespace or "default",
            settings.shard_ring,
            settings.shard_name,
            settings.shard_lease_seconds,
            namespaces=settings.namespaces,
            on_members=partial(_share_budget, aws.budget) if aws is not None else None,
        )
    scheduler = ResyncScheduler(
        reconciler,
        settings,
        partial(report_resync, reconciler),
        priority,
        owns=partial(owned, settings.shard_name) if shards is not None else None,
    )
    return Handlers(settings, reconciler, scheduler, shards, priority)


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    settings: Settings,
    aws: Aws | None = None,
) -> None:
    """Wire the handlers into `registry`: each kind's, the operator's start and stop, and
    (CloudAccounts served) the CloudAccount controller's."""
    handlers = build(reconciler, settings, aws)
    if reconciler.directory is not None:
        accounts_controller.register(registry, reconciler, settings, handlers.scheduler, aws)
    if reconciler.classes is not None:
        manage = settings.manages_accounts and aws is not None
        classes_controller.register(registry, reconciler, handlers.scheduler, manage)
    kopf.on.startup(registry=registry, id=STARTUP)(handlers.startup)
    kopf.on.cleanup(registry=registry, id=CLEANUP)(handlers.cleanup)
    kopf.on.login(registry=registry, id=LOGIN)(handlers.login)
    # One object per handler: kopf runs a handler that several causes of one event match (a
    # resource created while the operator was down is also resumed) once, by its identity.
    on_change, on_delete, on_drain = handlers.on_change, handlers.on_delete, handlers.on_drain
    for kind in KINDS:
        plural = kind.plural
        kw: dict[str, Any] = {"registry": registry}
        kopf.on.resume(GROUP, VERSION, plural, id=RECONCILE, **kw)(on_change)
        kopf.on.create(GROUP, VERSION, plural, id=RECONCILE, **kw)(on_change)
        kopf.on.update(GROUP, VERSION, plural, id=RECONCILE, **kw)(on_change)
        kopf.on.delete(GROUP, VERSION, plural, id=FINALIZE, **kw)(on_delete)
        if handlers.shards is not None:
            kopf.on.event(GROUP, VERSION, plural, id=HANDOVER, **kw)(on_drain)
    logging.getLogger("kopf.objects").addFilter(_quiet_watches)


def _quiet_watches(record: logging.LogRecord) -> bool:
    """kopf logs "Handler '...' succeeded." at INFO for every watch event of every namespace
    and CloudAccount, and (sharded) of every resource: nothing anyone reads. Failures are
    kept."""
    message = record.getMessage()
    return not (
        message.endswith("succeeded.")
        and any(f"'{name}'" in message for name in (ACCOUNT_WATCH, NAMESPACE_WATCH, HANDOVER))
    )
