"""The periodic resync: one loop for all resources instead of one kopf daemon each.

A kopf daemon per resource keeps a task, a stopper and a live copy of the body for every
object (about 20 KB each); this loop keeps a due time and a name. Each resource that
reconciled is re-checked every `resync_seconds` (+-10 % jitter, so 1,000 of them spread
out): its current body is read (a GET, never a write) once its lock is held, and
Reconciler.resync_current re-checks it.

After a restart, kopf resumes every resource. One at rest (Ready, Synced, the current
generation handled, nothing requested) is not observed then: it is handed to this loop with
a due time spread over one period (`track_resumed`), so a restart with 1,000 unchanged
resources costs no burst of cloud calls. With the resync off, every resume is a full pass.

A change of a CloudAccount or a namespace's labels asks for a recheck of the resources it
affects (`recheck`): a full pass as soon as the loop's next tick, whatever state they are in,
repeated while the pass asks to come back (a database being created).

The looks run on threads of their own (`Reconciler.look_executor`, half as many as the
change passes'), and a look whose kind's call budget has calls waiting already (creates,
changes, other looks: `Reconciler.look_backlog`) is put off until they have gone rather than
queued behind them: a create or a spec change never waits behind a round of looks, whether
for a thread or for the budget.

Under peering, a replica that is paused in favour of a higher-priority peer must not act:
kopf pauses its own handlers, and this loop checks the same peering object kopf uses.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from provisioner import tracing
from provisioner.config import Settings
from provisioner.kinds.contract import BatchObserver, BatchTagReader
from provisioner.model.resource import Resource
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Result
from provisioner.runtime import metrics

log = logging.getLogger(__name__)
PEERING_GROUP = "kopf.dev/v1"


class ResyncScheduler:
    def __init__(
        self,
        reconciler: Reconciler,
        settings: Settings,
        report: Callable[[Mapping[str, Any], tuple[Result, Resource], float], Awaitable[None]],
        peering_priority: int | None,
        owns: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.settings = settings
        # Events, metrics and the status patch of one resync pass (run inside its lock,
        # once the scheduler has tracked where the pass placed the resource).
        self.report = report
        self.peering_priority = peering_priority
        # Under sharding: whether a body is still this replica's to act on.
        self.owns = owns
        # uid -> (monotonic due time, kind, namespace, name, region, cloud name, account).
        self.due: dict[str, tuple[float, str, str, str, str, str, Any]] = {}
        # uid -> monotonic time of a recheck asked for (`recheck`).
        self.rechecks: dict[str, float] = {}
        # uid -> (monotonic time of its Expiring warning, of its expiry) for tracked resources
        # with spec.ttl or spec.expiresAt (infinity: warned already).
        self.expiries: dict[str, tuple[float, float]] = {}
        self._peering_cache: dict[str, tuple[float, bool]] = {}
        self._task: asyncio.Task[None] | None = None

    def _next(self) -> float:
        return time.monotonic() + self.settings.resync_seconds * random.uniform(0.9, 1.1)

    def track(self, resource: Resource, due: float | None = None) -> None:
        """Re-check `resource` from now on: at the monotonic time `due`, or one period on.
        Tracked already: its due time stays, where it lives is updated."""
        known = self.due.get(resource.uid)
        self.due[resource.uid] = (
            known[0] if known is not None else self._next() if due is None else due,
            resource.kind,
            resource.namespace,
            resource.name,
            resource.region,
            resource.external_name,
            resource.account,
        )
        self._track_expiry(resource)

    def _track_expiry(self, resource: Resource) -> None:
        """When to warn and when to delete, from the API server's clock (its answers' Date)."""
        if resource.expires_at is None:
            self.expiries.pop(resource.uid, None)
            return
        left = (resource.expires_at - self.reconciler.kube.server_now()).total_seconds()
        deadline = time.monotonic() + left
        warn = deadline - self.reconciler.warning_seconds(resource)
        known = self.expiries.get(resource.uid)
        if known is not None and known[0] == math.inf and warn <= time.monotonic():
            warn = math.inf  # warned already
        self.expiries[resource.uid] = (warn, deadline)

    @property
    def calm_resume(self) -> bool:
        """Whether a resumed resource at rest may wait for its resync (not with resync off:
        nothing else would ever look at it again)."""
        return self.settings.resync_seconds > 0

    def track_resumed(self, resource: Resource) -> float:
        """Re-check a resource at rest that a restart resumed, somewhere in the period after
        the first tenth of it; returns the delay in seconds.

        Nothing records when a resource was last observed (a pass that finds nothing to do
        writes nothing), only that the previous process looked at it at least once a period.
        The resumed resources are spread uniformly over one period: n of them make n/period
        passes a second, the load of the steady state, instead of all n at once. Starting at
        a tenth of the period keeps the first seconds after a restart, when kopf lists and
        watches everything, free of cloud calls; the last one is due 1.1 periods on, as late
        as the jittered steady state allows.
        """
        delay = self.settings.resync_seconds * random.uniform(0.1, 1.1)
        self.untrack(resource.uid)
        self.track(resource, time.monotonic() + delay)
        return delay

    def untrack(self, uid: str) -> None:
        self.due.pop(uid, None)
        self.rechecks.pop(uid, None)
        self.expiries.pop(uid, None)

    def recheck(self, uids: list[str], delay: float = 0.0) -> None:
        """A full pass of each of `uids` (tracked ones) at the next tick after `delay`."""
        at = time.monotonic() + delay
        for uid in uids:
            if uid in self.due:
                self.rechecks[uid] = min(at, self.rechecks.get(uid, at))

    def start(self) -> None:
        if self._task is None:  # rechecks run even with the periodic resync off
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="resync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    @property
    def batch_window(self) -> float:
        """How far ahead of their due time resources of a kind that is described in batches
        are taken along when one of them comes due: a tenth of the period (inside its +-10 %
        jitter), at most 30 s. At the default 300 s, a batch holds the resources due in the
        next 30 s instead of the one or two due in the same second."""
        return min(30.0, self.settings.resync_seconds / 10)

    def _take_due(self, now: float) -> list[tuple[str, tuple[float, str, str, str, str, str, Any]]]:
        ready = [(uid, entry) for uid, entry in self.due.items() if entry[0] <= now]
        batched = {
            kind
            for _, (_, kind, *_rest) in ready
            if isinstance(self.reconciler.clients.get(kind), (BatchObserver, BatchTagReader))
        }
        if batched:
            soon = now + self.batch_window
            ready += [
                (uid, entry)
                for uid, entry in self.due.items()
                if now < entry[0] <= soon and entry[1] in batched
            ]
        for uid, (_, *rest) in ready:
            self.due[uid] = (self._next(), *rest)
        return ready

    def _defer_busy(
        self,
        ready: list[tuple[str, tuple[float, str, str, str, str, str, Any]]],
        now: float,
    ) -> list[tuple[str, tuple[float, str, str, str, str, str, Any]]]:
        """The looks of `ready` to run now; those whose kind's call budget has calls waiting
        are due again once those have gone (plus up to a second, spread), not queued behind
        them. A look is only ever put off, never dropped."""
        backlog: dict[tuple[str, str, Any], float] = {}
        kept = []
        for uid, entry in ready:
            _, kind, _ns, _name, region, _cloud_name, account = entry
            key = (kind, region, account)
            if key not in backlog:
                backlog[key] = self.reconciler.look_backlog(kind, region, account)
            wait = backlog[key]
            if wait > 0:
                self.due[uid] = (now + wait + random.uniform(0.0, 1.0), *entry[1:])
                continue
            kept.append((uid, entry))
        if len(kept) < len(ready):
            log.debug(
                "%d looks put off: their call budget has calls waiting", len(ready) - len(kept)
            )
        return kept

    async def _loop(self) -> None:
        tick = max(0.2, min(1.0, self.settings.resync_seconds / 10))
        while True:
            await asyncio.sleep(tick)
            await self._expire(time.monotonic())
            await self._rechecks(time.monotonic())
            if self.settings.resync_seconds <= 0:
                continue
            now = time.monotonic()
            ready = self._defer_busy(self._take_due(now), now)
            if not ready:
                continue
            kinds: dict[str, list[tuple[str, str, str, Any]]] = {}
            for uid, (_, kind, _ns, _name, region, cloud_name, account) in ready:
                kinds.setdefault(kind, []).append((uid, region, cloud_name, account))
            for kind, due in kinds.items():
                try:
                    if described := await self.reconciler.prefetch(kind, due):
                        metrics.RESYNC_BATCHES.labels(kind).inc()
                        metrics.RESYNC_BATCHED.labels(kind).inc(described)
                except Exception:  # each pass then observes by itself
                    log.exception("batched describe of %s failed", kind)
            await asyncio.gather(
                *(self._one(uid, kind, ns, name) for uid, (_, kind, ns, name, *_) in ready),
                return_exceptions=True,
            )

    async def _expire(self, now: float) -> None:
        """Warn (a full pass sets Expiring and posts the Event), then delete, when due."""
        for uid, (warn, deadline) in list(self.expiries.items()):
            tracked = self.due.get(uid)
            if tracked is None:
                continue  # untracked meanwhile (deleted): its entry went with it
            _, kind, namespace, name, *_ = tracked
            if deadline <= now:
                if await self._paused(namespace):
                    continue
                try:
                    reference = {"metadata": {"uid": uid, "namespace": namespace, "name": name}}
                    with tracing.pass_span("expiry", reference, kind):
                        done = await self.reconciler.expire(uid, kind, namespace, name)
                except Exception:  # the next tick tries again
                    log.exception("expiring %s %s/%s failed", kind, namespace, name)
                    done = False
                if done:
                    self.expiries.pop(uid, None)
                elif uid in self.expiries:  # not yet by the API server's clock, or failed
                    self.expiries[uid] = (math.inf, now + 1.0)
            elif warn <= now:
                self.expiries[uid] = (math.inf, deadline)
                self.recheck([uid])

    async def _rechecks(self, now: float) -> None:
        due = [uid for uid, at in self.rechecks.items() if at <= now]
        for uid in due:
            del self.rechecks[uid]
        entries = [(uid, self.due[uid]) for uid in due if uid in self.due]
        if entries:
            await asyncio.gather(
                *(self._one(uid, e[1], e[2], e[3], recheck=True) for uid, e in entries),
                return_exceptions=True,
            )

    async def _one(
        self, uid: str, kind: str, namespace: str, name: str, recheck: bool = False
    ) -> None:
        try:
            if await self._paused(namespace):
                return

            async def load() -> dict[str, Any] | None:
                body = await self.reconciler.in_thread(
                    self.reconciler.kube.get_resource, kind, namespace, name
                )
                if body is None or body.get("metadata", {}).get("uid") != uid:
                    self.untrack(uid)
                    return None
                if self.owns is not None and not self.owns(body):
                    self.untrack(uid)  # handed over to another replica
                    return None
                body.setdefault("kind", kind)
                return body

            reference = {"metadata": {"uid": uid, "namespace": namespace, "name": name}}
            with tracing.pass_span("recheck" if recheck else "resync", reference, kind):
                again = await self.reconciler.resync_current(uid, load, self._reported, recheck)
            if recheck and again is not None:
                self.recheck([uid], again)
        except Exception:  # the next period tries again
            log.exception("resync of %s %s/%s failed", kind, namespace, name)

    async def _reported(
        self, body: Mapping[str, Any], outcome: tuple[Result, Resource], started: float
    ) -> None:
        """Track where one resync pass placed its resource, then `report` the pass."""
        self.track(outcome[1])
        await self.report(body, outcome, started)

    async def _paused(self, namespace: str) -> bool:
        """Whether a live peer with a higher priority holds this namespace (or the cluster)."""
        mine = self.peering_priority
        if not self.settings.peering or mine is None:
            return False
        clusterwide = not self.settings.namespaces
        key = "" if clusterwide else namespace
        cached = self._peering_cache.get(key)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        name = self.settings.peering
        path = (
            f"/apis/{PEERING_GROUP}/clusterkopfpeerings/{name}"
            if clusterwide
            else f"/apis/{PEERING_GROUP}/namespaces/{namespace}/kopfpeerings/{name}"
        )
        peering = await self.reconciler.in_thread(self.reconciler.kube.request, "GET", path) or {}
        now = datetime.now(UTC)
        paused = False
        for peer in (peering.get("status") or {}).values():
            try:
                seen = datetime.fromisoformat(str(peer["lastseen"]))
                if seen.tzinfo is None:
                    seen = seen.replace(tzinfo=UTC)
                alive = (now - seen).total_seconds() < float(peer.get("lifetime", 60))
                paused = paused or (alive and int(peer.get("priority", 0)) > mine)
            except (KeyError, TypeError, ValueError):
                continue
        self._peering_cache[key] = (time.monotonic() + 2.0, paused)
        return paused
