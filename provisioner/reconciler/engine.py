"""The generic reconciler: one code path for every kind.

observe -> (create | update) -> wait until available -> connection Secret -> status,
and on deletion: deletion policy -> wait for NotFound -> Secret -> release.

Every entry point takes the resource's lock, so the change handlers and the periodic
resync never act on one resource at once. The outcome of a pass is a `Result`; the
caller turns it into one status patch (nothing when nothing changed), the Events of
the state changes, and a requeue delay when the pass must be repeated.

Requested changes and drift: a field whose spec value changed since the spec last handled
is a requested change, applied in every case. Any other difference between the cloud and
the spec is drift, whatever pass finds it (a resync, an annotation or label edit, a
reconcile request, the resume after a restart): corrected by default, only reported
under `drift-policy: report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from provisioner.access.grants import Access
from provisioner.aws import errors
from provisioner.aws.turns import CALLER
from provisioner.config import Settings
from provisioner.crashpoints import crashpoint
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import (
    BatchObserver,
    BatchTagReader,
    ExternalClient,
    FieldDiff,
    Observation,
    PasswordClient,
)
from provisioner.kube.client import Kube, KubeError, valid_name
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model import connection_secret
from provisioner.model.resource import Dependency, Resource
from provisioner.placement.accounts import AccountRefused, Directory, pinned
from provisioner.reconciler import ownership
from provisioner.reconciler.failures import failure
from provisioner.reconciler.fair_slots import ContextThreadPool, FairSlots
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_BASE,
    WAIT_CAP,
    Event,
    Result,
    backoff,
    event_reference,
    where,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

# How long a batched describe's answer may stand in for a resync pass's own observation.
PREFETCH_TTL = 30.0
# Set inside a periodic look (a resync pass and its batched describe): its blocking calls
# run on the looks' own threads (`Reconciler.in_thread`).
LOOKING: contextvars.ContextVar[bool] = contextvars.ContextVar("looking", default=False)


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
        top = "spec.tags" if diff_field == "tags" else ".".join(diff_field.split(".")[:2])
        return top in self.paths


NOTHING_REQUESTED = Requested()
EVERYTHING_REQUESTED = Requested(everything=True)


def last_handled_spec(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spec kopf last handled successfully (its diff base in status.kopf), None if none."""
    stored = ((body.get("status") or {}).get("kopf") or {}).get("lastHandledConfiguration")
    if not stored:
        return None
    try:
        return dict(json.loads(stored).get("spec") or {})
    except (ValueError, AttributeError):
        return None


def requested_fields(
    last_handled: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Requested:
    """The spec fields that differ from the spec last handled (all of them when none was)."""
    if last_handled is None:
        return EVERYTHING_REQUESTED
    keys = set(last_handled) | set(current)
    return Requested(frozenset(f"spec.{k}" for k in keys if last_handled.get(k) != current.get(k)))


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


def _stamp(at: datetime) -> str:
    """A time as status and messages show it (RFC 3339, whole seconds, UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def planned(resource: Resource, requested: Requested) -> Requested:
    """After a plan, the changes it listed count as requested (the user saw and approved
    them), even where kopf already took the spec as handled while it was planned only."""
    plan = resource.status.get("plan") or {}
    if resource.plan_only or not plan.get("changes") or requested.everything:
        return requested
    fields = {str(c.get("field") or "") for c in plan["changes"]}
    tops = {"spec.tags" if f == "tags" else ".".join(f.split(".")[:2]) for f in fields if f}
    return Requested(requested.paths | frozenset(tops))


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        clients: dict[str, ExternalClient],
        post_event: Callable[[dict[str, Any], Event], None],
        directory: Directory | None = None,
        own_account: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings
        # spec.access, set by whoever runs it (it needs `in_thread`); None: no grants are
        # made, a resource that asks for some is told.
        self.access: Access | None = None
        # CloudAccounts and namespaces (None: this operator serves no CloudAccounts).
        self.directory = directory
        # The operator's own account id, for status.accountId (asked of STS once).
        self.own_account = own_account
        self.kube = kube
        self.clients = clients
        self.post_event = post_event
        # Its calls run in the pass's context: the call budget sees whose they are (CALLER).
        self.executor = ContextThreadPool(max_workers=settings.workers, thread_name_prefix="cloud")
        # The periodic looks have threads and a bound of their own (half as many): a look
        # waiting for the call budget, or a round of thousands of them, never holds a thread
        # or a pass slot that a create, a spec change or a deletion waits for.
        looks = max(1, settings.workers // 2)
        self.look_executor = ContextThreadPool(max_workers=looks, thread_name_prefix="look")
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # Bounds the passes in flight at once. A burst of 1,000 new resources then finishes in
        # waves (each one quickly) instead of all together at the end, holding far less memory.
        # A freed slot goes to the namespaces that wait in turn, and one namespace holds at
        # most `passes_per_namespace` (reconciler/fair_slots.py): a burst in one namespace
        # does not hold up another's resources.
        self.passes_in_flight = FairSlots(max(1, settings.workers), settings.passes_per_namespace)
        self.looks_in_flight = asyncio.Semaphore(looks)
        # Change passes (create, update, resume, delete, recheck) running or waiting for a
        # slot of `passes_in_flight`: while they fill every slot, the periodic looks wait
        # (`look_backlog`).
        self.changes_in_flight = 0
        # Master passwords of databases created by this process whose Secret is not
        # written yet. Lost on a crash, which is fine: a database found without its
        # Secret gets a new password (set in the cloud first, then written).
        self.pending_passwords: dict[str, str] = {}
        # Resources whose last pass was a resync that failed with a retryable error. Their
        # change handlers are done, so nothing but the next resync looks at them again.
        self.failed_resyncs: set[str] = set()
        # Fields written recently to kinds whose reads may lag behind writes (SQS): uid ->
        # field -> (value written, monotonic time until which an old value may still show).
        self.recent_writes: dict[str, dict[str, tuple[Any, float]]] = {}
        # Resources whose change handler is requeued (waiting on the cloud: `creating`, a name
        # held, a write settling). It looks again itself, with its own backoff; a resync in
        # between would only poll the cloud once more.
        self.requeued: set[str] = set()
        # Resources whose current generation was refused for good (InvalidSpec, NameConflict):
        # their resync looks at nothing until the spec changes, so no batch reads them.
        self.refused_for_generation: set[str] = set()
        # Resources last seen with the paused annotation: no batch reads them either.
        self.paused: set[str] = set()
        # What a batched describe said about resources whose resync is due (`prefetch`):
        # uid -> (monotonic time the describe started, the cloud's answer for it).
        self.prefetched: dict[str, tuple[float, Any]] = {}
        # uid -> monotonic time the last cloud write for it returned (infinity while one
        # runs): an answer fetched before that is stale and never stands in for an
        # observation.
        self.last_write: dict[str, float] = {}
        # uid -> (namespace, CloudAccount name: where its last pass placed it or the one it
        # was refused; "" for the operator's own): who to look at again when a CloudAccount
        # or a namespace changes. `refused`: those whose last pass was refused for it.
        self.account_of: dict[str, tuple[str, str]] = {}
        self.refused: set[str] = set()

    # -- helpers ------------------------------------------------------------------

    async def in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (boto3, the Kubernetes client) on the cloud thread pool; inside
        a periodic look (`LOOKING`), on the looks' own."""
        loop = asyncio.get_running_loop()
        executor = self.look_executor if LOOKING.get() else self.executor
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    @contextlib.asynccontextmanager
    async def _change_pass(self, uid: str, namespace: str = "") -> AsyncIterator[None]:
        """A slot of `passes_in_flight` in `namespace`'s turn ("": not known) and the
        resource's lock, counted as a change; its AWS calls wait their turn as that
        namespace's at the call budget."""
        self.changes_in_flight += 1
        caller = CALLER.set(namespace)
        try:
            async with self.passes_in_flight.slot(namespace), self.locks[uid]:
                yield
        finally:
            CALLER.reset(caller)
            self.changes_in_flight -= 1

    @property
    def changes_busy(self) -> bool:
        """Whether change passes fill every slot (or wait for one)."""
        return self.changes_in_flight >= max(1, self.settings.workers)

    def look_backlog(self, kind: str, region: str, account: Any = None) -> float:
        """Seconds a periodic look of `kind` (in that account and region) should wait rather
        than start now; 0: start it. The resync defers it by that much instead of queueing
        it (creates and changes go first):

        - while change passes fill every slot: to a random time in the next period. A look
          costs about what a create costs (a GET of the resource and of its Secret, the
          cloud's reads); with thousands of resources the looks coming due during a long
          burst of creates would otherwise take a share of the API server and the cloud
          that grows with the number of resources, and the burst's time with it. Spread
          over the next period (not all due again a few seconds on), those put off during
          a burst do not all come back together when it ends;
        - the seconds the calls already waiting on the call budget of `kind`'s service
          still wait, when any does."""
        if self.changes_busy:
            return self.settings.resync_seconds * random.uniform(0.1, 1.0)
        budget = getattr(getattr(self.clients.get(kind), "aws", None), "budget", None)
        if budget is None:
            return 0.0
        service = kinds.descriptor(kind).service
        return float(budget.backlog(service, region, account.account_id if account else ""))

    def resource(self, body: Mapping[str, Any]) -> Resource:
        resource = kinds.parse(
            body, region=self.settings.region, cluster_id=self.settings.cluster_id
        )
        # A paused resource gets no cloud call at all, batched reads included.
        if resource.paused:
            self.paused.add(resource.uid)
        else:
            self.paused.discard(resource.uid)
        return resource

    def forget(self, uid: str) -> None:
        self.prefetched.pop(uid, None)
        self.last_write.pop(uid, None)
        self.locks.pop(uid, None)
        self.pending_passwords.pop(uid, None)
        self.failed_resyncs.discard(uid)
        self.recent_writes.pop(uid, None)
        self.requeued.discard(uid)
        self.refused_for_generation.discard(uid)
        self.paused.discard(uid)
        self.account_of.pop(uid, None)
        self.refused.discard(uid)

    def affected(self, *, account: str | None = None, namespace: str | None = None) -> list[str]:
        """The resources to look at again after a change of the CloudAccount `account` (those
        placed in it or refused it), or of `namespace` (those in it that use or were refused
        a CloudAccount)."""
        return [
            uid
            for uid, (ns, name) in self.account_of.items()
            if (account is not None and name == account)
            or (namespace is not None and ns == namespace and (name or uid in self.refused))
        ]

    async def _place(self, resource: Resource, deleting: bool = False) -> Resource:
        """The resource with the account and region it acts in; AccountRefused when it may
        not act there (before any cloud call)."""
        directory = self.directory
        Directory.check_region(
            directory, resource.spec_region, resource.status, self.settings, deleting
        )
        attempted = resource.spec_account or str(resource.status.get("account") or "")
        if directory is None:
            if resource.spec_account:
                raise AccountRefused(
                    cond.ACCOUNT_NOT_FOUND,
                    f"CloudAccount {resource.spec_account}: this operator serves no "
                    "CloudAccounts (started with --accounts=off)",
                )
            return resource
        try:
            placement = await self.in_thread(
                directory.place,
                resource.namespace,
                resource.spec_account,
                resource.spec_region,
                resource.status,
                self.settings.region,
                deleting,
            )
        except AccountRefused:
            if not attempted:
                attempted = directory.namespace(resource.namespace).default_account
            self.account_of[resource.uid] = (resource.namespace, attempted)
            raise
        account = placement.account
        self.account_of[resource.uid] = (resource.namespace, account.name if account else "")
        return dataclasses.replace(
            resource, region=placement.region, account=account.ref if account else None
        )

    def known_placement(self, resource: Resource) -> Resource:
        """Where a resource that already lives somewhere is, from its status and the
        CloudAccounts already known (no API call): for the resync schedule of one at rest
        after a restart. Unknown: the resource as it is (its first pass places it)."""
        if self.directory is None or "account" not in resource.status:
            return resource
        name = str(resource.status.get("account") or "")
        account = self.directory.accounts.get(name) if name else None
        if name and account is None:
            return resource
        region = resource.spec_region or str(resource.status.get("region") or resource.region)
        return dataclasses.replace(
            resource, region=region, account=account.ref if account else None
        )

    def _account_id(self, resource: Resource) -> str:
        if resource.account is not None:
            return resource.account.account_id
        try:
            return self.own_account() if self.own_account else ""
        except errors.CloudError:
            return ""  # only a label: unknown while STS does not say (an endpoint without it)

    def _placement_fields(self, resource: Resource) -> dict[str, Any]:
        """status.account ("" for the operator's own), accountId and region (nothing when
        this operator serves no CloudAccounts: the status then reads as before them)."""
        if self.directory is None:
            return {}
        return {
            "account": resource.account.name if resource.account else "",
            "accountId": self._account_id(resource),
            "region": resource.region,
        }

    async def _write(self, resource: Resource, fn: Callable[..., T], *args: Any) -> T:
        """A call that changes the cloud (create, update, a password, delete). While it runs,
        and for any batched describe that started before it returned, the batch's answer
        may predate the write: `last_write` is "now and later" until it returns."""
        self.last_write[resource.uid] = math.inf
        try:
            return await self.in_thread(fn, *args)
        finally:
            self.last_write[resource.uid] = time.monotonic()

    async def prefetch(self, kind: str, due: list[tuple[str, str, str, Any]]) -> int:
        """Describe the resources of `kind` whose resync is due, (uid, region, cloud name,
        account),
        in batches where the kind's cloud allows it, for their passes to use right after;
        returns how many were described. A failed or partial answer costs nothing: those
        passes observe by themselves."""
        client = self.clients.get(kind)
        describe: Callable[..., Mapping[str, Any]]
        if isinstance(client, BatchObserver):
            describe = client.describe_many
        elif isinstance(client, BatchTagReader):
            describe = client.tags_many  # the tags only: each pass reads the rest itself
        else:
            return 0
        now = time.monotonic()
        for uid in [u for u, (at, _) in self.prefetched.items() if now - at > PREFETCH_TTL]:
            del self.prefetched[uid]
        described = 0
        regions: defaultdict[tuple[str, Any], list[tuple[str, str]]] = defaultdict(list)
        for uid, region, name, account in due:
            if uid in self.requeued:  # its change handler looks by itself; no resync
                continue
            if uid in self.refused_for_generation or uid in self.paused:  # no look is due
                continue
            regions[(region, account)].append((uid, name))
        for (region, account), wanted in regions.items():
            started = time.monotonic()
            token = LOOKING.set(True)
            try:
                found = await self.in_thread(describe, region, [n for _, n in wanted], account)
            except errors.CloudError as exc:
                log.info("batched describe of %d %s failed: %s", len(wanted), kind, exc)
                continue
            finally:
                LOOKING.reset(token)
            for uid, name in wanted:
                if name in found:
                    self.prefetched[uid] = (started, found[name])
                    described += 1
        return described

    def _fresh_prefetched(self, resource: Resource) -> Any | None:
        """The batched answer for a resync pass (used once), if nothing was written since."""
        fetched = self.prefetched.pop(resource.uid, None)
        if fetched is None:
            return None
        started, described = fetched
        if started <= self.last_write.get(resource.uid, -1.0):
            return None
        if time.monotonic() - started > PREFETCH_TTL:
            return None
        return described

    def _prefetched(self, client: ExternalClient, resource: Resource) -> Observation | None:
        """The batched describe's answer for a resync pass, if nothing was written since."""
        if not isinstance(client, BatchObserver):
            return None
        described = self._fresh_prefetched(resource)
        return None if described is None else client.observed(resource, described)

    def _prefetched_tags(self, client: ExternalClient, resource: Resource) -> dict[str, str] | None:
        """The batched tag read's answer for a resync pass, if nothing was written since."""
        if not isinstance(client, BatchTagReader):
            return None
        tags = self._fresh_prefetched(resource)
        return None if tags is None else dict(tags)

    async def _observe(
        self, client: ExternalClient, resource: Resource, resync: bool = False
    ) -> Observation:
        """Observe, leaving out what the cloud may not show yet: a field written within its
        kind's settle time whose read still shows the previous value is neither written again
        nor drift (`Observation.settling` names it). A field the cloud shows as written, or
        shows with a third value, or whose settle time is over, is forgotten. A resync pass
        uses the batched describe's answer (`prefetch`) when there is a fresh one, or for a
        kind whose tags are read in batches, those tags."""
        obs = self._prefetched(client, resource) if resync else None
        tags = self._prefetched_tags(client, resource) if resync and obs is None else None
        if obs is None and tags is not None and isinstance(client, BatchTagReader):
            obs = await self.in_thread(client.observe_tagged, resource, tags)
        if obs is None:
            obs = await self.in_thread(client.observe, resource)
        written = self.recent_writes.pop(resource.uid, None)
        if not written:
            return obs
        now = time.monotonic()
        settling = [
            d
            for d in obs.diffs
            if d.field in written and written[d.field][1] > now and d.desired == written[d.field][0]
        ]
        if settling:
            self.recent_writes[resource.uid] = {d.field: written[d.field] for d in settling}
            obs.diffs = [d for d in obs.diffs if d not in settling]
            obs.settling = [d.field for d in settling]
        return obs

    def _remember_writes(self, resource: Resource, written: list[FieldDiff]) -> None:
        settle = kinds.descriptor(resource.kind).settle_seconds
        if settle <= 0 or not written:
            return
        until = time.monotonic() + settle
        self.recent_writes.setdefault(resource.uid, {}).update(
            {d.field: (d.desired, until) for d in written}
        )

    @staticmethod
    def terminal_for_generation(resource: Resource) -> bool:
        synced = cond.find(resource.status.get("conditions"), cond.SYNCED)
        return bool(
            synced
            and synced.get("status") == "False"
            and synced.get("reason") in (cond.INVALID_SPEC, cond.NAME_CONFLICT)
            and synced.get("observedGeneration") == resource.generation
        )

    @staticmethod
    def settled(resource: Resource) -> bool:
        """The change handlers are done with the current generation and it succeeded."""
        synced = cond.find(resource.status.get("conditions"), cond.SYNCED)
        return bool(
            synced
            and synced.get("status") == "True"
            and resource.status.get("observedGeneration") == resource.generation
        )

    @classmethod
    def at_rest(cls, resource: Resource, body: Mapping[str, Any]) -> bool:
        """Nothing asks for a pass now: the current generation was handled and is Ready and
        Synced, no request (reconcile, password rotation) waits, the resource is neither
        paused nor being deleted. A resume after a restart finds most resources like this;
        their next look at the cloud is the periodic resync."""
        return bool(
            cls.settled(resource)
            and cond.is_true(resource.status, cond.READY)
            and not resource.paused
            and not resource.reconcile_request_pending
            and not resource.rotation_pending
            and not (body.get("metadata") or {}).get("deletionTimestamp")
        )

    def status_patch(self, resource: Resource, result: Result) -> dict[str, Any]:
        return cond.status_patch(
            resource.status,
            result.conditions,
            resource.generation if result.for_generation else None,
            result.fields,
        )

    def emit(self, body: dict[str, Any], resource: Resource, result: Result) -> None:
        """Post the Result's own Events plus one per state change of a condition.

        Synced=True is news only when it recovers from False; Ready is news when its
        status or reason changes (not its wording alone: "available" while a change is
        pending, then "available; Secret written", is one state).
        """
        for event in result.events:
            if event.reason in CLOUD_CHANGES:
                event = self._attributed(resource, event)
            self.post_event(event_reference(body), event)
        for c in result.conditions:
            if c.type not in (cond.READY, cond.SYNCED) or not cond.changed(resource.status, c):
                continue
            previous = cond.find(resource.status.get("conditions"), c.type)
            if (
                c.type == cond.SYNCED
                and c.status
                and (previous is None or previous["status"] == "True")
            ):
                continue
            if (
                c.type == cond.READY
                and previous is not None
                and previous.get("status") == ("True" if c.status else "False")
                and previous.get("reason") == c.reason
            ):
                continue
            quiet = c.status or c.reason in (
                cond.CREATING,
                cond.DELETING,
                cond.WAITING_FOR_DEPENDENCY,
                cond.PLAN_ONLY,
            )
            self.post_event(
                event_reference(body),
                Event("Normal" if quiet else "Warning", c.reason, c.message or c.reason),
            )

    def _attributed(self, resource: Resource, event: Event) -> Event:
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

    # -- plans and expiry --------------------------------------------------------------

    async def _plan(self, resource: Resource) -> tuple[Result, Resource]:
        """plan-only: what a pass would do, in status.plan. Reads only: no cloud write, no
        Secret, no status pin; the spec is not handled (observedGeneration stays)."""
        name = resource.external_name
        changes: list[dict[str, str]] = []
        try:
            resource = await self._place(resource)
            action, reason = await self._planned_action(resource, changes)
        except AccountRefused as exc:
            action, reason = "Blocked", f"{exc.reason}: {exc.message}"
        except errors.CloudError as exc:
            action, reason = "Blocked", f"the cloud could not be observed: {exc}"
        plan = {
            "action": action,
            "reason": reason,
            "changes": changes,
            "generation": resource.generation,
            "plannedAt": _stamp(self.kube.server_now()),
        }
        message = (
            f"plan-only ({action}): {reason}; remove the {annotation_keys.PLAN_ONLY} "
            "annotation to apply it"
        )
        conditions = [cond.Condition(cond.SYNCED, False, cond.PLAN_ONLY, message)]
        if not cond.find(resource.status.get("conditions"), cond.READY):
            conditions.insert(
                0, cond.Condition(cond.READY, False, cond.PLAN_ONLY, f"{name}: planned only")
            )
        return Result(conditions=conditions, fields={"plan": plan}, for_generation=False), resource

    async def _planned_action(
        self, resource: Resource, changes: list[dict[str, str]]
    ) -> tuple[str, str]:
        name, kind = resource.external_name, resource.kind
        for dependency in resource.dependencies:
            if await self._ready_arn(resource.namespace, dependency) is None:
                return "Blocked", f"waiting for {dependency.role} {dependency.name} to be Ready"
        obs = await self.in_thread(self.clients[kind].observe, resource)
        action = self._action(resource, obs)
        if action == "Blocked":
            return (
                action,
                f"{name} exists in the cloud and is {ownership.owner(resource, obs)}: "
                "it would be left untouched",
            )
        if action == "Create":
            place = where(resource.account.name if resource.account else "")
            return action, f"create {kind} {name} in {place}, {resource.region}"
        if action == "None":
            return action, f"{name} matches the spec: nothing to do"
        changes += [
            {"field": d.field, "cloud": _shown(d.observed), "spec": _shown(d.desired)}
            for d in obs.diffs
        ]
        reason = f"update {name}: {', '.join(d.field for d in obs.diffs)}"
        if resource.drift_report_only:
            reason += " (drift-policy report: only the fields changed in the spec are written)"
        return action, reason

    def _action(self, resource: Resource, obs: Observation) -> str:
        """What a pass does with what it observed: Blocked, Create, Update or None."""
        if obs.exists and not ownership.is_ours(resource, obs):
            return "Blocked"
        if not obs.exists:
            return "Create"
        return "Update" if obs.diffs else "None"

    def _against_plan(self, resource: Resource, obs: Observation, events: list[Event]) -> None:
        """Applying after a plan: say what differs from what the plan said."""
        plan = resource.status.get("plan") or {}
        action = self._action(resource, obs)
        now = {d.field: _shown(d.desired) for d in obs.diffs}
        then = {c.get("field"): c.get("spec") for c in plan.get("changes") or []}
        differences = []
        if plan.get("generation") != resource.generation:
            differences.append(
                f"the spec changed since (planned generation {plan.get('generation')}, "
                f"now {resource.generation})"
            )
        if plan.get("action") != action:
            differences.append(f"the plan said {plan.get('action')}, the cloud now needs {action}")
        elif action == "Update" and now != then:
            differences.append(f"the plan changed {sorted(then)}, now {sorted(now)}")
        if differences:
            events.append(Event("Warning", "PlanChanged", "; ".join(differences)))

    def _expiry(self, resource: Resource, result: Result) -> None:
        """status.expiresAt and the condition Expiring, with a Warning Event when it begins."""
        expires = resource.expires_at
        had = cond.find(resource.status.get("conditions"), cond.EXPIRING)
        if expires is None:
            result.fields["expiresAt"] = None
            if had is not None and had.get("status") == "True":
                result.conditions.append(
                    cond.Condition(cond.EXPIRING, False, cond.EXPIRY_SCHEDULED, "no expiry")
                )
            return
        at = _stamp(expires)
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
        if resource.expires_at > self.kube.server_now():
            return False
        await self.in_thread(self.kube.delete_resource, kind, namespace, name, uid)
        at = _stamp(resource.expires_at)
        event = Event(
            "Normal",
            "Expired",
            f"expired at {at}: deleted, deletionPolicy {resource.deletion_policy}",
        )
        self.post_event(event_reference(body), self._attributed(resource, event))
        return True

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
        resource = self.resource(body)
        requested = requested_fields(last_handled_spec, body.get("spec") or {})
        async with self._change_pass(resource.uid, resource.namespace):
            self.failed_resyncs.discard(resource.uid)  # the change handlers retry from here
            self.requeued.discard(resource.uid)
            if resource.paused:
                return self._paused(resource), resource
            asked_to_reconcile = resource.reconcile_request_pending
            if self.terminal_for_generation(resource) and not asked_to_reconcile:
                self.refused_for_generation.add(resource.uid)
                return Result(for_generation=False), resource
            result, resource = await self._pass(resource, retry, requested)
            if asked_to_reconcile:
                result.fields["lastReconcileRequest"] = resource.annotation(
                    annotation_keys.RECONCILE_REQUESTED_AT
                )
            if result.requeue_after is not None:
                self.requeued.add(resource.uid)
            return result, resource

    async def _pass(
        self, resource: Resource, retry: int, requested: Requested, resync: bool = False
    ) -> tuple[Result, Resource]:
        """Place the resource, then observe and converge it; every failure becomes a
        condition. Returns the outcome and the resource as placed (when it could be)."""
        events: list[Event] = []
        requested = planned(resource, requested)
        try:
            if resource.plan_only:
                result, resource = await self._plan(resource)
            else:
                resource = await self._place(resource)
                result = await self._sync(resource, retry, requested, events, resync=resync)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a condition
            result = failure(resource, exc, retry)
            result.events[:0] = events  # what the pass did before it failed still happened
        self._expiry(resource, result)
        synced = next((c for c in result.conditions if c.type == cond.SYNCED), None)
        if synced is not None and not synced.status and synced.reason in cond.ACCOUNT_REASONS:
            self.refused.add(resource.uid)
        else:
            self.refused.discard(resource.uid)
        if (
            synced is not None
            and not synced.status
            and synced.reason in (cond.INVALID_SPEC, cond.NAME_CONFLICT)
        ):
            self.refused_for_generation.add(resource.uid)
        else:
            self.refused_for_generation.discard(resource.uid)
        return result, resource

    async def _recheck(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        """A full pass after a change of its CloudAccount or namespace, whatever state the
        resource is in (refused, waiting on its change handler's backoff, at rest)."""
        resource = self.resource(body)
        if resource.paused:
            return None
        requested = requested_fields(last_handled_spec(body), body.get("spec") or {})
        result, resource = await self._pass(resource, 0, requested)
        if result.requeue_after is None:
            self.requeued.discard(resource.uid)  # done: its periodic resync may look again
        return result, resource

    async def resync(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        """The periodic re-check: drift, vanished resources, edited or deleted Secrets."""
        uid = str(body["metadata"]["uid"])
        async with self.passes_in_flight, self.locks[uid]:
            return await self._resync(body)

    async def resync_current(
        self,
        uid: str,
        load: Callable[[], Awaitable[Mapping[str, Any] | None]],
        report: Callable[[Mapping[str, Any], tuple[Result, Resource], float], Awaitable[None]],
        recheck: bool = False,
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
            return await self._resync_current(uid, load, report, recheck)
        finally:
            LOOKING.reset(token)

    @contextlib.asynccontextmanager
    async def _look(self, uid: str) -> AsyncIterator[None]:
        async with self.looks_in_flight, self.locks[uid]:
            yield

    async def _resync_current(
        self,
        uid: str,
        load: Callable[[], Awaitable[Mapping[str, Any] | None]],
        report: Callable[[Mapping[str, Any], tuple[Result, Resource], float], Awaitable[None]],
        recheck: bool,
    ) -> float | None:
        async with self._change_pass(uid) if recheck else self._look(uid):
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

    async def _resync(self, body: Mapping[str, Any]) -> tuple[Result, Resource] | None:
        resource = self.resource(body)
        if resource.paused or not (self.settled(resource) or resource.uid in self.failed_resyncs):
            return None
        if resource.uid in self.requeued:
            return None  # its change handler looks again by itself, with its backoff
        result, resource = await self._pass(resource, 0, NOTHING_REQUESTED, resync=True)
        result.requeue_after = None
        synced = next((c for c in result.conditions if c.type == cond.SYNCED), None)
        if (
            synced
            and not synced.status
            and synced.reason in (cond.RECONCILE_ERROR, *cond.ACCESS_REASONS)
        ):
            self.failed_resyncs.add(resource.uid)
        else:
            self.failed_resyncs.discard(resource.uid)
        return result, resource

    @staticmethod
    def _paused(resource: Resource) -> Result:
        return Result(
            conditions=[
                cond.Condition(
                    cond.SYNCED,
                    False,
                    cond.PAUSED,
                    f"paused by the {annotation_keys.PAUSED} annotation: no cloud calls until "
                    "it is removed or set to false",
                )
            ],
            for_generation=False,
        )

    async def finalize(self, body: Mapping[str, Any], retry: int = 0) -> tuple[Result, Resource]:
        resource = self.resource(body)
        async with self._change_pass(resource.uid, resource.namespace):
            try:
                result = await self._delete(resource, retry)
            except errors.NotSupportedError as exc:
                # The endpoint has no such service, so nothing of ours can exist there.
                await self._delete_secret(resource)
                result = Result(release_finalizer=True, for_generation=False)
                result.events.append(Event("Normal", "Deleted", f"nothing to delete: {exc}"))
            except Exception as exc:  # noqa: BLE001
                result = failure(resource, exc, retry, deleting=True)
        if result.release_finalizer:
            self.forget(resource.uid)
        return result, resource

    # -- the passes -------------------------------------------------------------------

    async def _sync(
        self,
        resource: Resource,
        retry: int,
        requested: Requested,
        events: list[Event],
        resync: bool = False,
    ) -> Result:
        """observe -> create or apply changes -> wait until available -> Secret -> Ready.

        `events` collects what the pass did as it goes, so that a failure later in the
        pass does not lose them (a Created or PasswordChanged before a Secret conflict).
        """
        client = self.clients[resource.kind]
        resolved, waiting = await self._resolve_dependencies(resource, retry)
        if waiting is not None:
            return waiting
        resource = dataclasses.replace(resource, resolved=resolved)

        conditions: list[cond.Condition] = []
        obs = await self._observe(client, resource, resync)
        if resource.status.get("plan"):
            self._against_plan(resource, obs, events)
        if obs.exists and not ownership.is_ours(resource, obs):
            return ownership.name_conflict(resource, obs)
        if not obs.exists:
            obs = await self._create(resource, client, resync, events)
            if not obs.exists:
                return self._creating(resource, retry, events)
        if obs.diffs and obs.available:
            obs = await self._apply_changes(resource, client, obs, requested, conditions, events)
        elif obs.available and cond.is_true(resource.status, cond.DRIFTED):
            conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))

        fields = {
            "plan": None,  # applied: a plan made before is done with
            "externalName": resource.external_name,
            "arn": obs.arn,
            **(await self.in_thread(self._placement_fields, resource)),
            **obs.status,
        }
        if obs.deleting or not obs.available:
            return self._not_available(resource, obs, retry, fields, conditions, events)
        pending = [d for d in obs.diffs if not self._reported_only(resource, d, requested)]
        if pending:
            return self._pending(resource, pending, retry, fields, conditions, events)
        return await self._ready(resource, client, obs, retry, fields, conditions, events)

    async def _resolve_dependencies(
        self, resource: Resource, retry: int
    ) -> tuple[dict[str, str], Result | None]:
        """The ARNs of the resources this one needs, or the Result that says it waits."""
        resolved: dict[str, str] = {}
        for dependency in resource.dependencies:
            found = await self._ready_arn(resource.namespace, dependency)
            if found is None:
                return resolved, self._waiting_for(dependency, retry)
            arn, account = found
            mine = resource.account.name if resource.account else ""
            if account != mine:
                raise AccountRefused(
                    cond.INVALID_SPEC,
                    f"{dependency.role} {dependency.name} lives in "
                    f"{where(account)}, this resource in {where(mine)}: "
                    "both must be in one account",
                )
            resolved[dependency.key] = arn
        return resolved, None

    async def _create(
        self, resource: Resource, client: ExternalClient, resync: bool, events: list[Event]
    ) -> Observation:
        """Create the cloud resource (safe to repeat after a crash) and observe it again."""
        name = resource.external_name
        token = ownership.create_token(resource)
        unnamed = not client.tags_on_create and resource.status.get("createToken") != token
        # Pinned before the call once the cluster has CloudAccounts at all: a cluster without
        # any pays no extra write per create (its resources can only live in one account).
        unplaced = (
            self.directory is not None
            and "account" not in resource.status
            and self.directory.in_use()
        )
        if unnamed or unplaced:
            # Recorded before the call. The account and region: a resource never moves, even
            # if its namespace's default account changes after a crash right after the
            # create. The name: the proof that an untagged resource of this name is our own
            # interrupted create (S3 tags only after CreateBucket).
            before = await self.in_thread(self._placement_fields, resource) if unplaced else {}
            if unnamed:
                before.update(externalName=name, createToken=token)
            await self.in_thread(
                self.kube.patch_status, resource.kind, resource.namespace, resource.name, before
            )
            resource.status.update(before)
        if resync and not unnamed:
            events.append(
                Event("Warning", "Vanished", f"{name} disappeared from the cloud; recreating it")
            )
        create_secrets: dict[str, str] = {}
        if isinstance(client, PasswordClient):
            password = self.pending_passwords.setdefault(
                resource.uid, connection_secret.generate_password()
            )
            create_secrets["password"] = password
        known: Observation | None = None
        try:
            known = await self._write(resource, client.create, resource, create_secrets)
        except errors.ConflictError:
            # An earlier attempt may have succeeded with its answer lost on the way
            # back: "already exists" is ours if the tags say so.
            obs = await self._observe(client, resource)
            if not (obs.exists and ownership.is_ours(resource, obs)):
                raise
        crashpoint("after-create")
        events.append(Event("Normal", "Created", f"created {resource.kind} {name}"))
        return known if known is not None else await self._observe(client, resource)

    @staticmethod
    def _reported_only(resource: Resource, diff: FieldDiff, requested: Requested) -> bool:
        """Drift that `drift-policy: report` leaves in place (a requested change never is)."""
        return resource.drift_report_only and not requested.covers(diff.field)

    async def _apply_changes(
        self,
        resource: Resource,
        client: ExternalClient,
        obs: Observation,
        requested: Requested,
        conditions: list[cond.Condition],
        events: list[Event],
    ) -> Observation:
        """Write the requested changes and correct drift (or only report it); observe again."""
        name = resource.external_name
        if ownership.adopting(resource, obs):
            # Taking over: the spec wins on every field, and that is no drift.
            events.append(Event("Normal", "Adopted", f"took over existing {name}"))
            requested = EVERYTHING_REQUESTED
        changes = [d for d in obs.diffs if requested.covers(d.field)]
        drift = [d for d in obs.diffs if not requested.covers(d.field)]
        described = "; ".join(d.describe() for d in drift)
        to_write = changes if resource.drift_report_only else changes + drift
        if drift and resource.drift_report_only:
            conditions.append(cond.Condition(cond.DRIFTED, True, cond.DRIFT_REPORTED, described))
            if cond.changed(resource.status, conditions[-1]):
                events.append(
                    Event("Warning", "Drifted", f"not corrected (report only): {described}")
                )
        elif drift:
            conditions.append(cond.Condition(cond.DRIFTED, False, cond.DRIFT_CORRECTED, described))
            events.append(Event("Warning", "Drifted", f"corrected: {described}"))
        elif cond.is_true(resource.status, cond.DRIFTED):
            conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))
        if not to_write:
            return obs
        await self._write(resource, client.update, resource, obs, to_write)
        self._remember_writes(resource, to_write)
        if changes:
            updated = ", ".join(d.field for d in changes)
            events.append(Event("Normal", "Updated", f"updated {updated}"))
        return await self._observe(client, resource)

    @staticmethod
    def _creating(resource: Resource, retry: int, events: list[Event]) -> Result:
        name = resource.external_name
        return Result(
            conditions=[cond.Condition(cond.READY, False, cond.CREATING, f"creating {name}")],
            fields={"externalName": name},
            events=events,
            requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
        )

    @staticmethod
    def _not_available(
        resource: Resource,
        obs: Observation,
        retry: int,
        fields: dict[str, Any],
        conditions: list[cond.Condition],
        events: list[Event],
    ) -> Result:
        """The resource exists but does not serve yet (or any more): wait and look again."""
        reason = cond.CREATING if obs.state in ("creating", "") else cond.UNAVAILABLE
        return Result(
            conditions=[
                cond.Condition(
                    cond.READY,
                    False,
                    reason,
                    f"{resource.external_name} is {obs.state or 'not ready'}",
                ),
                cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
                *conditions,
            ],
            fields=fields,
            events=events,
            requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
        )

    @staticmethod
    def _pending(
        resource: Resource,
        pending: list[FieldDiff],
        retry: int,
        fields: dict[str, Any],
        conditions: list[cond.Condition],
        events: list[Event],
    ) -> Result:
        """Written, but the cloud does not show it yet: Synced=False until it does."""
        described = "; ".join(d.describe() for d in pending)
        return Result(
            conditions=[
                cond.Condition(
                    cond.READY, True, cond.AVAILABLE, f"{resource.external_name} is available"
                ),
                cond.Condition(
                    cond.SYNCED,
                    False,
                    cond.RECONCILE_ERROR,
                    f"the cloud has not applied: {described}",
                ),
                *conditions,
            ],
            fields=fields,
            events=events,
            requeue_after=backoff(retry),
        )

    async def _ready(
        self,
        resource: Resource,
        client: ExternalClient,
        obs: Observation,
        retry: int,
        fields: dict[str, Any],
        conditions: list[cond.Condition],
        events: list[Event],
    ) -> Result:
        """Available and in line with the spec: write the Secret, report Ready."""
        fields.update(await self._write_secret(resource, client, obs, events))
        fields["connectionSecret"] = resource.secret_name
        problem: cond.Condition | None = None
        access_retry = False
        if self.access is not None:
            granted = await self.access.converge(resource, obs.arn)
            if granted is not None:
                fields["access"] = granted.entries
                events += [Event(*e) for e in granted.events]
                problem, access_retry = granted.problem, granted.retry
        available = (
            f"{resource.external_name} is available; "
            f"connection Secret {resource.secret_name} is written"
        )
        if pending := obs.status.get("pendingChanges"):
            available += f"; the cloud is applying: {pending}"
        synced = ""
        requeue_after = None
        if obs.settling:
            # Written just now; reads may lag (SQS: up to 60 s). Look again to confirm.
            settle = kinds.descriptor(resource.kind).settle_seconds
            synced = (
                f"written: {', '.join(obs.settling)}; the cloud may show the previous value "
                f"for up to {settle:.0f} s"
            )
            requeue_after = backoff(retry, WAIT_BASE, WAIT_CAP)
        if problem is not None:
            # The resource serves; a grant waits on something outside the spec. Looked at
            # again with a backoff (a conflict, which people must resolve, slowly).
            delay = backoff(retry, cap=RETRY_CAP if access_retry else CREDENTIALS_RETRY_CAP)
            requeue_after = min(requeue_after or delay, delay)
        return Result(
            conditions=[
                cond.Condition(cond.READY, True, cond.AVAILABLE, available),
                problem or cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS, synced),
                *conditions,
            ],
            fields=fields,
            events=events,
            requeue_after=requeue_after,
        )

    @staticmethod
    def _waiting_for(dependency: Dependency, retry: int) -> Result:
        return Result(
            conditions=[
                cond.Condition(
                    cond.READY,
                    False,
                    cond.WAITING_FOR_DEPENDENCY,
                    f"waiting for {dependency.role} {dependency.name} to be Ready",
                ),
                cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
            ],
            requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
        )

    async def _write_secret(
        self, resource: Resource, client: ExternalClient, obs: Observation, events: list[Event]
    ) -> dict[str, Any]:
        """Write the connection Secret if its content differs; for databases, own the password.

        Password order: the cloud first, then the Secret, then status. A crash after the
        cloud accepted a new password leaves the rotation (or the missing Secret) pending,
        so the next pass sets yet another password and writes that one: the Secret always
        ends with the password the cloud accepted last.
        """
        fields: dict[str, Any] = {}
        existing = await self.in_thread(
            self.kube.get_secret, resource.namespace, resource.secret_name
        )
        owned = existing is not None and connection_secret.owned_by(existing, resource)
        if existing is not None and not owned:
            # Refused before any password change: a password set in the cloud but never
            # written would be known to nobody, and set anew at every retry.
            connection_secret.needs_write(existing, resource, {})  # raises SecretConflict
        data = dict(obs.connection)
        password: str | None = None
        if isinstance(client, PasswordClient):
            stored = (
                connection_secret.stored_password(
                    existing, resource.secret_keys, partial(client.with_password, data)
                )
                if owned and existing
                else None
            )
            password = stored or self.pending_passwords.get(resource.uid)
            rotate = resource.rotation_pending
            if rotate or not password:
                # Rotation asked, or nobody knows the password any more (Secret deleted,
                # adopted instance, crash between create and Secret): a new one, cloud first.
                password = connection_secret.generate_password()
                await self._write(resource, client.set_password, resource, password)
                crashpoint("after-password-set")
                what = "rotated on request" if rotate else "reset: the Secret had none"
                events.append(Event("Normal", "PasswordChanged", f"master password {what}"))
                if rotate:
                    fields["lastPasswordRotation"] = resource.annotation(
                        annotation_keys.ROTATE_PASSWORD_AT
                    )
            data = client.with_password(data, password)
        try:
            data = connection_secret.render(resource.secret_keys, data)
        except connection_secret.TemplateError as exc:
            raise errors.NotSupportedError(str(exc)) from None
        if connection_secret.needs_write(existing, resource, data, password):
            body = connection_secret.build(resource, data, password)
            if existing is None:
                await self.in_thread(self.kube.create_secret, resource.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                await self.in_thread(
                    self.kube.replace_secret, resource.namespace, resource.secret_name, body
                )
            if existing is not None or resource.status.get("connectionSecret"):
                events.append(
                    Event(
                        "Normal",
                        "SecretWritten",
                        f"connection Secret {resource.secret_name} restored or updated",
                    )
                )
        self.pending_passwords.pop(resource.uid, None)
        return fields

    async def _ready_arn(self, namespace: str, dependency: Dependency) -> tuple[str, str] | None:
        """The dependency's ARN and CloudAccount name ("" for the operator's own) once it is
        Ready; None while it is not (or is going away)."""
        target = await self.in_thread(
            self.kube.get_resource, dependency.kind, namespace, dependency.name
        )
        if not target or target.get("metadata", {}).get("deletionTimestamp"):
            return None
        status = target.get("status") or {}
        if not cond.is_true(status, cond.READY) or not status.get("arn"):
            return None
        return str(status["arn"]), str(status.get("account") or "")

    def _namespace_terminating(self, namespace: str) -> bool:
        """Whether the namespace is being deleted: a paused resource in it is deleted then,
        so that the namespace (and a CloudAccount waiting for its resources) can go. False
        where the operator may not read namespaces."""
        try:
            found = self.kube.get_namespace(namespace)
        except KubeError:
            return False
        meta, status = (found or {}).get("metadata") or {}, (found or {}).get("status") or {}
        return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"

    async def _delete(self, resource: Resource, retry: int) -> Result:
        name = resource.external_name
        done = Result(release_finalizer=True, for_generation=False)
        if resource.paused:
            if not await self.in_thread(self._namespace_terminating, resource.namespace):
                paused = self._paused(resource)
                paused.conditions.insert(
                    0,
                    cond.Condition(
                        cond.READY,
                        False,
                        cond.DELETING,
                        "deletion waits until the resource is unpaused (or its namespace "
                        "is deleted)",
                    ),
                )
                paused.requeue_after = backoff(retry, WAIT_BASE, 15.0)
                return paused
            done.events.append(
                Event(
                    "Warning",
                    "PauseOverridden",
                    f"namespace {resource.namespace} is being deleted: the "
                    f"{annotation_keys.PAUSED} annotation no longer holds the deletion, "
                    f"deletionPolicy {resource.deletion_policy} applies",
                )
            )
        # Only what status.access holds: it records each grant before anything is made for it.
        access = self.access if resource.status.get("access") else None
        if resource.deletion_policy == "Retain" and access is None:
            return await self._retain(resource, done)
        try:
            resource = await self._place(resource, deleting=True)
        except AccountRefused:
            if pinned(resource.status):
                raise
            # Never placed, so nothing was ever created: nothing to delete anywhere.
            await self._delete_secret(resource)
            return done
        if access is not None:
            # Access goes first, whatever happens to the resource itself.
            done.events += [Event(*e) for e in await access.revoke_all(resource)]
        if resource.deletion_policy == "Retain":
            return await self._retain(resource, done)
        client = self.clients[resource.kind]
        obs = await self.in_thread(client.observe, resource)
        if obs.exists and not ownership.is_ours(resource, obs):
            await self._delete_secret(resource)
            done.events.append(
                Event(
                    "Warning",
                    "LeftUntouched",
                    f"{name} is not ours; the cloud resource was not deleted",
                )
            )
            return done
        if obs.exists and not obs.deleting:
            try:
                await self._write(resource, client.delete, resource, obs)
                crashpoint("after-delete-call")
            except errors.DeletionBlocked as exc:
                return Result(
                    conditions=[cond.Condition(cond.READY, False, cond.DELETING, exc.message)],
                    for_generation=False,
                    requeue_after=backoff(retry, WAIT_BASE, 15.0),
                )
            obs = await self.in_thread(client.observe, resource)
        if obs.exists:
            return Result(
                conditions=[
                    cond.Condition(
                        cond.READY,
                        False,
                        cond.DELETING,
                        f"deleting {name} ({obs.state or 'in progress'})",
                    )
                ],
                for_generation=False,
                requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
            )
        await self._delete_secret(resource)
        done.events.append(Event("Normal", "Deleted", f"deleted {resource.kind} {name}"))
        return done

    async def _retain(self, resource: Resource, done: Result) -> Result:
        await self._delete_secret(resource)
        done.events.append(
            Event(
                "Normal",
                "Retained",
                f"{resource.external_name} retained by deletionPolicy Retain",
            )
        )
        return done

    async def _delete_secret(self, resource: Resource) -> None:
        if not valid_name(resource.secret_name):
            return  # no Secret can have that name: there is none to delete
        existing = await self.in_thread(
            self.kube.get_secret, resource.namespace, resource.secret_name
        )
        if existing and connection_secret.owned_by(existing, resource):
            await self.in_thread(
                self.kube.delete_secret,
                resource.namespace,
                resource.secret_name,
                existing["metadata"]["uid"],
            )
