"""The reconciler's engine: the entry points and one pass, going forward through the
stages, each in its own module:

    classing -> guardrails -> placement -> plan-only | (dependencies -> observe -> converge ->
    readiness (connection Secret, access)) -> failure mapping -> expiry

and on deletion: delete (guardrails, placement, access, the cloud, the Secret).

Every entry point takes the resource's lock, so the change handlers and the periodic
resync never act on one resource at once. The outcome of a pass is a `Result`; the caller
turns it into one status patch (nothing when nothing changed), the Events of the state
changes (`events`), and a requeue delay when the pass must be repeated. What the engine
remembers of a resource between passes is one record per uid (`state`), and what it
schedules by is the pass's typed `Verdict`, never a condition's reason.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from provisioner import tracing
from provisioner.access.grants import Access
from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ExternalClient
from provisioner.kube.client import Kube
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.placement.accounts import Directory
from provisioner.placement.classes import Classes
from provisioner.reconciler import guardrails, ownership, readiness
from provisioner.reconciler.classing import Classing
from provisioner.reconciler.converge import Converge
from provisioner.reconciler.delete import Deletion
from provisioner.reconciler.dependencies import Dependencies
from provisioner.reconciler.events import Events, status_patch
from provisioner.reconciler.expiry import Expiry
from provisioner.reconciler.failures import failure
from provisioner.reconciler.grants import Grants
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.outcome import Event, Result, Verdict, event_reference, placed
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.plan import Planner, against_plan
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import (
    NOTHING_REQUESTED,
    Requested,
    by_class,
    immutable_by_class,
    last_handled_spec,
    planned,
    requested_fields,
)
from provisioner.reconciler.secret import ConnectionSecret
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import LOOKING, Workers

Report = Callable[[Mapping[str, Any], tuple[Result, Resource], float], Awaitable[None]]
Load = Callable[[], Awaitable[Mapping[str, Any] | None]]


class Reconciler:
    # What runs where, read by the handlers too.
    at_rest = staticmethod(guardrails.at_rest)
    status_patch = staticmethod(status_patch)

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        clients: dict[str, ExternalClient],
        post_event: Callable[[dict[str, Any], Event], None],
        directory: Directory | None = None,
        own_account: Callable[[], str] | None = None,
        classes: Classes | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.clients = clients
        self.post_event = post_event
        self.directory = directory
        self.states = States()
        self.workers = Workers(settings, clients, self.states)
        self.classing = Classing(classes, self.resource, self.workers, self.states)
        self.classed = self.classing.classed
        self.class_affected = self.classing.affected
        self.placement = Placement(settings, directory, own_account, self.workers, self.states)
        self.observer = Observer(clients, self.workers, self.states)
        self.dependencies = Dependencies(kube, self.workers)
        self.planner = Planner(kube, self.placement, self.dependencies, self.observer)
        self.converge = Converge(kube, self.workers, self.observer, self.placement, self.states)
        self.secret = ConnectionSecret(kube, self.workers, self.states)
        self.grants = Grants()
        self.deletion = Deletion(
            kube, clients, self.workers, self.placement, self.observer, self.secret, self.grants
        )
        self.expiry = Expiry(kube, settings)
        self.events = Events(settings, post_event)
        # The threads and the look's bound, for the runtime that shares them.
        self.in_thread = self.workers.in_thread
        self.executor = self.workers.executor
        self.look_executor = self.workers.look_executor
        self.prefetch = self.observer.prefetch
        self.look_backlog = self.workers.look_backlog
        self.known_placement = self.placement.known
        self.affected = self.placement.affected
        self.emit = self.events.emit
        self.warning_seconds = self.expiry.warning_seconds

    @property
    def classes(self) -> Classes | None:
        """ResourceClasses (None: served only with CloudAccounts, --accounts=on)."""
        return self.classing.classes

    @property
    def access(self) -> Access | None:
        """spec.access, set by whoever runs it (None: no grants are made, a resource that
        asks for some is told)."""
        return self.grants.access

    @access.setter
    def access(self, access: Access | None) -> None:
        self.grants.access = access

    def lock(self, uid: str) -> Any:
        """The resource's lock (held by every pass over it)."""
        return self.states.of(uid).lock

    def forget(self, uid: str) -> None:
        self.states.forget(uid)

    def resource(self, body: Mapping[str, Any]) -> Resource:
        resource = kinds.parse(
            body, region=self.settings.region, cluster_id=self.settings.cluster_id
        )
        # A paused resource gets no cloud call at all, batched reads included.
        self.states.of(resource.uid).paused = resource.paused
        return resource

    # -- entry points ---------------------------------------------------------------

    async def reconcile(
        self,
        body: Mapping[str, Any],
        retry: int = 0,
        last_handled_spec: Mapping[str, Any] | None = None,
    ) -> tuple[Result, Resource]:
        """A pass for a new generation, a resume, or an annotation or label change.

        `last_handled_spec` is the spec as the last successful pass saw it (None for a new
        resource): the fields that differ from it are the requested changes.
        """
        resource = await self.classed(body)
        requested = planned(resource, requested_fields(last_handled_spec, body.get("spec") or {}))
        async with self.workers.change_pass(resource.uid, resource.namespace):
            state = self.states.of(resource.uid)
            state.failed_resync = False  # the change handlers retry from here
            state.requeued = False
            if resource.paused:
                return guardrails.paused(resource), resource
            asked_to_reconcile = resource.reconcile_request_pending
            if guardrails.terminal_for_generation(resource) and not asked_to_reconcile:
                state.refused_for_generation = True
                return Result(for_generation=False), resource
            result, resource = await self._pass(resource, retry, requested)
            if asked_to_reconcile:
                result.fields["lastReconcileRequest"] = resource.annotation(
                    annotation_keys.RECONCILE_REQUESTED_AT
                )
            state.requeued = result.requeue_after is not None
            return result, resource

    async def resync(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        """The periodic re-check: drift, vanished resources, edited or deleted Secrets."""
        async with self.workers.resync_slot(str(body["metadata"]["uid"])):
            return await self._resync(body)

    async def resync_current(
        self, uid: str, load: Load, report: Report, recheck: bool = False
    ) -> float | None:
        """The periodic re-check of the body as it is once the resource's lock is held (with
        `recheck`, the full pass a CloudAccount's or namespace's change asks for); returns
        the delay after which that pass wants another one (None: done).

        Reading it inside the lock (not before waiting for it) means a change handler that
        ran meanwhile is seen: no pass on an older spec, no cloud call after `paused`, and
        no second Event for a state that pass already reported. The status patch is written
        before the lock is released, for the same reason.
        """
        # Its own pass bound and threads (`look_executor`): a change pass never waits for a
        # look. A recheck after a CloudAccount's change is a change pass.
        token = LOOKING.set(not recheck)
        try:
            slot = self.workers.change_pass(uid) if recheck else self.workers.look(uid)
            async with slot:
                return await self._look_at_current(uid, load, report, recheck)
        finally:
            LOOKING.reset(token)

    async def finalize(self, body: Mapping[str, Any], retry: int = 0) -> tuple[Result, Resource]:
        # Its class still completes the spec (a deletionPolicy or deletionProtection from
        # it holds); one it may no longer use does not keep it from being deleted.
        resource = await self.classed(body)
        if resource.class_refused is not None:
            resource = self.resource(body)
        async with self.workers.change_pass(resource.uid, resource.namespace):
            try:
                result = await self.deletion.delete(resource, retry)
            except errors.NotSupportedError as exc:
                # The endpoint has no such service, so nothing of ours can exist there.
                await self.secret.delete(resource)
                result = Result(release_finalizer=True, for_generation=False)
                result.events.append(Event("Normal", "Deleted", f"nothing to delete: {exc}"))
            except Exception as exc:  # noqa: BLE001
                result = failure(resource, exc, retry, deleting=True)
        if result.release_finalizer:
            self.forget(resource.uid)
        return result, resource

    async def expire(self, uid: str, kind: str, namespace: str, name: str) -> bool:
        """Delete the resource if its expiry has come (by the API server's clock); False while
        it has not (True: deleted, or nothing to do). The finalizer honours its deletionPolicy."""
        body = await self.in_thread(self.kube.get_resource, kind, namespace, name)
        meta = (body or {}).get("metadata") or {}
        if not body or meta.get("uid") != uid or meta.get("deletionTimestamp"):
            return True  # gone, or going already
        body.setdefault("kind", kind)
        resource = self.resource(body)
        if resource.expires_at is None:
            return True  # no expiry any more
        if not self.expiry.due(resource):
            return False
        await self.in_thread(self.kube.delete_resource, kind, namespace, name, uid)
        event = self.events.attributed(resource, self.expiry.expired(resource))
        self.post_event(event_reference(body), event)
        return True

    # -- the passes -------------------------------------------------------------------

    async def _look_at_current(
        self, uid: str, load: Load, report: Report, recheck: bool
    ) -> float | None:
        started = time.monotonic()
        body = await load()
        if body is None or body.get("metadata", {}).get("uid") != uid:
            return None
        if body["metadata"].get("deletionTimestamp"):
            return None
        outcome = await (self._recheck(body) if recheck else self._resync(body))
        if outcome is None:
            return None
        await report(body, outcome, started)
        return outcome[0].requeue_after

    async def _recheck(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        """A full pass after a change of its CloudAccount or namespace, whatever state the
        resource is in (refused, waiting on its change handler's backoff, at rest)."""
        resource = await self.classed(body)
        if resource.paused:
            return None
        requested = planned(
            resource, requested_fields(last_handled_spec(body), body.get("spec") or {})
        )
        result, resource = await self._pass(resource, 0, requested)
        if result.requeue_after is None:
            self.states.of(resource.uid).requeued = False  # its periodic resync may look again
        return result, resource

    async def _resync(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        resource = await self.classed(body)
        state = self.states.of(resource.uid)
        if resource.paused or not (guardrails.settled(resource) or state.failed_resync):
            return None
        if state.requeued:
            return None  # its change handler looks again by itself, with its backoff
        result, resource = await self._pass(
            resource, 0, planned(resource, NOTHING_REQUESTED), resync=True
        )
        result.requeue_after = None
        state.failed_resync = result.verdict.resync_retries
        return result, resource

    async def _pass(
        self, resource: Resource, retry: int, requested: Requested, resync: bool = False
    ) -> tuple[Result, Resource]:
        """Place the resource, then observe and converge it; every failure becomes a
        condition. Returns the outcome and the resource as placed (when it could be)."""
        p = Progress(
            resource, kinds.descriptor(resource.kind), retry, by_class(resource, requested), resync
        )
        p.events += immutable_by_class(resource, requested)
        try:
            if resource.class_refused is not None:
                raise resource.class_refused
            if resource.plan_only:
                result, resource = await self.planner.plan(resource)
            else:
                with tracing.span("placement") as placing:
                    p.resource = resource = await self.placement.place(resource)
                    if placing is not None:
                        tracing.set_attributes(placed(resource))
                result = await self._converge(p)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a condition
            result = failure(resource, exc, retry)
            result.events[:0] = p.events  # what the pass did before it failed still happened
        self.expiry.report(resource, result)
        state = self.states.of(resource.uid)
        state.refused = result.verdict is Verdict.REFUSED_BY_ACCOUNT
        state.refused_for_generation = result.verdict.refused_for_generation
        return result, resource

    async def _converge(self, p: Progress) -> Result:
        """dependencies -> observe -> create or apply changes -> wait until available ->
        connection Secret -> access -> Ready."""
        client = self.clients[p.resource.kind]
        resolved = await self.dependencies.resolve(p.resource, p.retry)
        if isinstance(resolved, Result):
            return resolved
        p.resource = resource = resolved
        obs = await self.observer.observe(resource, p.resync)
        if resource.status.get("plan"):
            p.events += against_plan(resource, obs)
        if obs.exists and not ownership.is_ours(resource, obs):
            return ownership.name_conflict(resource, obs)
        if not obs.exists:
            obs = await self.converge.create(p, client, obs)
            if not obs.exists:
                return readiness.creating(p)
        if obs.diffs and obs.available:
            await self.secret.before_changes(p, client, obs)
            obs = await self.converge.apply_changes(p, client, obs)
        elif obs.available and cond.is_true(resource.status, cond.DRIFTED):
            p.conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))
        p.fields.update(
            {
                "plan": None,  # applied: a plan made before is done with
                "externalName": resource.external_name,
                "arn": obs.arn,
                **readiness.class_field(resource),
                **(await self.in_thread(self.placement.fields, resource)),
                **obs.status,
            }
        )
        waiting = readiness.waiting(p, obs)
        if waiting is not None:
            return waiting
        await self.secret.write(p, client, obs)
        problem, retry = await self.grants.grant(p, p.kind.access_arns(resource, obs))
        return readiness.ready(p, obs, problem, retry)
