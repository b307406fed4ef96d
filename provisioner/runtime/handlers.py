"""kopf registration: the same handler set for every kind.

- create / update / resume -> Reconciler.reconcile (status merged into kopf's own patch);
                             a resume of a resource at rest only schedules its resync
- delete                   -> Reconciler.finalize (kopf holds our finalizer until it returns)
- one resync loop          -> Reconciler.resync of each resource every `resync_seconds`
- CloudAccounts, Namespaces -> watched into the account directory; a change rechecks the
                             resources it affects. With `manages_accounts`, also: Ready from
                             an AssumeRole (at each change and every 30 s), and a finalizer
                             held while resources use one.

kopf keeps its bookkeeping (handler progress, last-handled spec) in `status.kopf`,
so a pass that finishes writes a single status patch and no annotations.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import kopf

from provisioner import (
    ACCOUNTS_API_VERSION,
    ACCOUNTS_VERSION,
    API_VERSION,
    FINALIZER,
    GROUP,
    VERSION,
)
from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.config import Settings
from provisioner.kinds.registry import KINDS
from provisioner.kube import login as kubelogin
from provisioner.kube.client import Kube, KubeError
from provisioner.kube.inventory import custom_resources
from provisioner.model import conditions as cond
from provisioner.model import conversion
from provisioner.model.resource import Resource
from provisioner.placement import accounts
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.fair_slots import FairSlots, fair_requests, fair_workers
from provisioner.reconciler.outcome import Event, Result
from provisioner.runtime import metrics, sharding
from provisioner.runtime.resync import ResyncScheduler

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """A deep, plain-dict copy of a kopf body view (kopf's views are read-only and live).

    managedFields, often the bulk of an object, are left out: nothing here reads them.
    """
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items() if k != "managedFields"}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


# Events waiting for their post at most; past that a new one is dropped (and counted in
# the log), as client-go's recorder drops Events when its queue of 1,000 is full.
EVENT_BACKLOG = 1000


def event_poster(
    kube: Kube, executor: Executor, backlog: int = EVENT_BACKLOG
) -> Callable[[dict[str, Any], Event], None]:
    """Events are posted in the background: a pass never waits for them, and a failure to
    post one is logged, never fatal. A burst of thousands of creates against a slow API
    server queues at most `backlog` of them: memory stays bounded, and Events are not
    still being posted minutes after the burst."""
    lock = threading.Lock()
    waiting = dropped = 0

    def post(body: dict[str, Any], event: Event) -> None:
        nonlocal waiting, dropped
        with lock:
            if waiting >= backlog:
                dropped += 1
                if dropped % 100 == 1:
                    log.warning("%d Events dropped: %d wait for the API server", dropped, waiting)
                return
            waiting += 1
        future = executor.submit(
            kube.post_event, body, event.type, event.reason, event.message, "provisioner"
        )
        future.add_done_callback(posted)

    def posted(future: Future[None]) -> None:
        nonlocal waiting
        with lock:
            waiting -= 1
        _log_failure(future)

    return post


def _log_failure(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("could not post an Event: %s", exc)


class HubDiffBaseStorage(kopf.StatusDiffBaseStorage):
    """kopf's last-handled configuration, read at the version the operator watches.

    One stored by an operator that watched v1alpha1 spells fields the old way; compared
    as it is with a v1beta1 body, every resource would look changed after an upgrade.
    The sharding labels are no part of it: a resource handed to another replica is resumed
    there, not taken for changed.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return _without_shard_labels(super().build(body=body, extra_fields=extra_fields))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        essence = super().fetch(body=body)
        if essence is None:
            return None
        converted = conversion.essence_to_hub(essence, str(body.get("kind", "")))
        return _without_shard_labels(cast(kopf.BodyEssence, converted))


def _without_shard_labels(essence: kopf.BodyEssence) -> kopf.BodyEssence:
    meta: Mapping[str, Any] = essence.get("metadata") or {}
    labels = meta.get("labels")
    if not labels or not (sharding.SHARD_LABEL in labels or sharding.DRAIN_LABEL in labels):
        return essence
    plain_essence = dict(essence)
    kept = {
        k: v for k, v in labels.items() if k not in (sharding.SHARD_LABEL, sharding.DRAIN_LABEL)
    }
    new_meta = {k: v for k, v in meta.items() if k != "labels"}
    if kept:
        new_meta["labels"] = kept
    if new_meta:
        plain_essence["metadata"] = new_meta
    else:
        plain_essence.pop("metadata", None)
    return cast(kopf.BodyEssence, plain_essence)


def configure_kopf(
    kopf_settings: kopf.OperatorSettings, settings: Settings, priority: int | None
) -> None:
    kopf_settings.persistence.finalizer = FINALIZER
    kopf_settings.persistence.progress_storage = kopf.StatusProgressStorage(
        field="status.kopf.progress"
    )
    kopf_settings.persistence.diffbase_storage = HubDiffBaseStorage(
        field="status.kopf.lastHandledConfiguration"
    )
    # Cluster-wide or with exact namespace names nothing needs discovering at run time (and
    # no RBAC on namespaces or CRDs is needed); glob patterns need the namespace observer.
    kopf_settings.scanning.disabled = not any(
        ch in pattern for pattern in settings.namespaces for ch in "*?!,"
    )
    kopf_settings.watching.server_timeout = 300
    kopf_settings.watching.client_timeout = 330
    kopf_settings.watching.connect_timeout = 10
    kopf_settings.networking.connect_timeout = 10
    kopf_settings.networking.request_timeout = 60
    # kopf runs one worker per object and keeps it for `idle_timeout` after its last event.
    # A bounded number of workers keeps a burst of 1,000 new resources from holding 1,000
    # bodies, diffs and patches in memory at once; a short idle time keeps objects from
    # queueing behind the idle workers of others. The bound (of each kind's) is kept by
    # `fair_workers`, each namespace in turn and at most half of them in one namespace (none
    # with --namespace-max-passes=0): kopf's own would be one queue, first come first served,
    # for all the namespaces a watch serves (cluster-wide, one per kind).
    kopf_settings.batching.worker_limit = None
    workers = 2 * max(1, settings.workers)
    fair_workers(workers, workers // 2 if settings.passes_per_namespace else 0, GROUP)
    kopf_settings.batching.idle_timeout = 0.5
    if settings.peering:
        kopf_settings.peering.name = settings.peering
        kopf_settings.peering.standalone = False
        kopf_settings.peering.mandatory = True
        kopf_settings.peering.clusterwide = not settings.namespaces
        kopf_settings.peering.lifetime = settings.peering_lifetime
        kopf_settings.peering.priority = priority or 0
    else:
        kopf_settings.peering.standalone = True
    if settings.sharding:
        # Each replica sees only the resources labelled with its shard (server side).
        for kind in KINDS:
            kopf_settings.watching.label_selectors[GROUP, kind.plural] = (
                f"{sharding.SHARD_LABEL}={settings.shard_name}"
            )


def account_directory(kube: Kube) -> accounts.Directory:
    return accounts.Directory(
        lambda name: kube.request("GET", f"/apis/{ACCOUNTS_API_VERSION}/{accounts.PLURAL}/{name}"),
        lambda name: kube.request("GET", f"/api/v1/namespaces/{name}"),
    )


def account_users(kube: Kube, name: str) -> list[str]:
    """The resources that live in the CloudAccount `name`, or name it and wait to be
    created there: "namespace/Kind/name", sorted."""
    users = []
    for item in custom_resources(kube):
        status, spec = item.get("status") or {}, item.get("spec") or {}
        lives = status.get("account") == name
        waits = "account" not in status and spec.get("account") == name
        if lives or waits:
            meta = item["metadata"]
            users.append(f"{meta['namespace']}/{item['kind']}/{meta['name']}")
    return sorted(users)


async def wait_for_api(reconciler: Reconciler) -> None:
    """Block start-up until the API server serves every kind of ours.

    kopf resolves the resources it serves once, right after start-up (re-discovery would
    need rights on every CRD). An operator that starts while the API server restarts, or
    before the CRDs are established, would otherwise serve nothing until restarted.
    """
    delay = 0.5
    while True:
        try:
            wanted = {API_VERSION: {k.plural for k in KINDS}}
            if reconciler.directory is not None:
                wanted.setdefault(ACCOUNTS_API_VERSION, set()).add(accounts.PLURAL)
            missing: set[str] = set()
            for api_version, plurals in wanted.items():
                found = await reconciler.in_thread(
                    reconciler.kube.request, "GET", f"/apis/{api_version}"
                )
                missing |= plurals - {r.get("name") for r in (found or {}).get("resources", [])}
            if not missing:
                return
            log.warning("waiting for the CRDs of %s to be served", ", ".join(sorted(missing)))
        except Exception as exc:  # noqa: BLE001 - the API server is not answering yet
            log.warning("waiting for the API server: %s", exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


# kopf's requests in flight at once (finalizers, status and progress patches) besides its
# watch streams. Each connection is a TLS connection holding a read buffer that asyncio
# allocates and zeroes whole (64 KiB once `provisioner run` has installed
# provisioner.runtime.footprint, 256 KiB without): 8 keep up with the 64 workers kopf runs, whose
# patches take milliseconds.
API_REQUESTS_IN_FLIGHT = 8
# Of those, one namespace's at most (`bounded_session`): a burst in one namespace (a finalizer
# patch for each of 1,000 new resources) leaves the others room at once, and its own load on
# the API server stays low enough that their requests are answered about as fast as when
# idle.
API_REQUESTS_PER_NAMESPACE = 2


def api_connection_limit(settings: Settings) -> int:
    """Connections to the API server: the watch streams (each kind and peering per namespace;
    CloudAccounts and namespaces cluster-wide), which hold theirs for good, plus
    `API_REQUESTS_IN_FLIGHT`. 0 (unlimited) when globs hide the namespace count."""
    if any(ch in pattern for pattern in settings.namespaces for ch in "*?!,"):
        return 0
    streams = (len(KINDS) + 1) * max(1, len(settings.namespaces)) + 2
    return streams + API_REQUESTS_IN_FLIGHT


def bounded_session(creds: kubelogin.Credentials, settings: Settings) -> kopf.AiohttpSession:
    """kopf's own session opens a connection per concurrent request without a limit; a
    burst of 1,000 status patches then holds 1,000 TLS connections of 256 KiB buffers each.
    The same session with a bounded pool queues the requests instead, each namespace's in
    turn (`fair_requests`): a burst in one namespace does not hold up another's."""
    per_namespace = API_REQUESTS_PER_NAMESPACE if settings.passes_per_namespace else 0
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=api_connection_limit(settings), ssl=creds.ssl_context()
        ),
        headers=creds.headers(),
        middlewares=[fair_requests(FairSlots(API_REQUESTS_IN_FLIGHT, per_namespace))],
    )
    # kopf logs in again when the credentials are refused (a rotated token) or expire.
    expires = (
        datetime.fromtimestamp(creds.expires - kubelogin.EXEC_RENEW_SECONDS, UTC)
        if creds.expires is not None
        else None
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=creds.server,
        default_namespace=creds.namespace,
        expiration=expires,
    )


def _outcome(result: Result) -> str:
    synced = next((c for c in result.conditions if c.type == cond.SYNCED), None)
    if result.release_finalizer:
        return "deleted"
    if synced is not None and not synced.status:
        if synced.reason in (cond.INVALID_SPEC, cond.NAME_CONFLICT, cond.PAUSED):
            return synced.reason
        return "error"
    return "requeue" if result.requeue_after is not None else "success"


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
        resource.uid,
        kind,
        [(c["type"], c["status"], c.get("reason", "")) for c in merged],
    )


def _report(
    reconciler: Reconciler,
    body: dict[str, Any],
    outcome: tuple[Result, Resource],
    started: float,
) -> dict[str, Any]:
    """Events and metrics of one pass; returns its status patch ({} when nothing changed)."""
    result, resource = outcome
    reconciler.emit(body, resource, result)
    _measure(body, resource, result, started)
    return reconciler.status_patch(resource, result)


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


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    settings: Settings,
    aws: Aws | None = None,
) -> None:
    # Peers of equal priority all pause (kopf), so each replica draws its own once.
    priority = None
    if settings.peering:
        priority = settings.peering_priority
        if priority is None:
            priority = random.randint(1, 2**30)

    shards = None
    if settings.sharding:
        namespace = settings.namespace or reconciler.kube.creds.namespace or "default"
        shards = sharding.Shards(
            reconciler.kube,
            namespace,
            settings.shard_ring,
            settings.shard_name,
            settings.shard_lease_seconds,
            namespaces=settings.namespaces,
            on_members=(lambda n: aws.budget.set_share(1 / n)) if aws is not None else None,
        )

    def handed_over(body: Any) -> bool:
        """A resource being drained (or no longer this replica's) is left alone."""
        if shards is None:
            return False
        labels = (body.get("metadata") or {}).get("labels") or {}
        return not sharding.owns(labels, settings.shard_name)

    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, reconciler.settings, priority)
        await wait_for_api(reconciler)
        if shards is not None:
            await shards.wait_member()
            shards.start()
        scheduler.start()

    async def cleanup(**_: Any) -> None:
        await scheduler.stop()
        if shards is not None:
            # kopf's handlers are done by now; a cancelled resync may still have a cloud call
            # on a thread. Leave the ring at once only when none has.
            await shards.stop(leave=await _cloud_calls_done(reconciler, 10.0))

    async def login(**_: Any) -> kopf.AiohttpSession:
        creds = await asyncio.to_thread(kubelogin.login)
        return bounded_session(creds, settings)

    async def on_change(
        body: Any, old: Any, patch: kopf.Patch, retry: int, reason: Any = None, **_: Any
    ) -> None:
        if handed_over(body):
            # Left pending for the new owner. kopf records when to try again in status.kopf
            # and the new owner keeps to it: a short delay, so that it does not wait.
            raise kopf.TemporaryError("handed over to another replica", delay=1)
        raw, started = plain(body), time.monotonic()
        if reason == kopf.Reason.RESUME and retry == 0 and scheduler.calm_resume:
            # A restart: a resource at rest waits for its resync, spread over one period.
            # A changed spec or annotation is an update, a deletion a delete: handled now.
            resource = reconciler.resource(raw)
            if reconciler.at_rest(resource, raw):
                delay = scheduler.track_resumed(reconciler.known_placement(resource))
                metrics.CONDITIONS.record(
                    resource.uid,
                    resource.kind,
                    [
                        (c["type"], c["status"], c.get("reason", ""))
                        for c in resource.status.get("conditions") or []
                    ],
                )
                log.debug("%s at rest: next observed in %.0fs", resource.ref, delay)
                return
        # kopf's `old` is the last successfully handled state (None for a new resource): the
        # spec fields that differ from it are the user's requested changes; anything else
        # the cloud differs in is drift.
        last_spec = plain((old or {}).get("spec") or {}) if old is not None else None
        result, resource = outcome = await reconciler.reconcile(raw, retry, last_spec)
        scheduler.track(resource)
        if status := _report(reconciler, raw, outcome, started):
            patch.setdefault("status", {}).update(status)
        if result.requeue_after is not None:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after)

    async def on_delete(body: Any, patch: kopf.Patch, retry: int, **_: Any) -> None:
        if handed_over(body):
            raise kopf.TemporaryError("handed over to another replica", delay=1)
        raw, started = plain(body), time.monotonic()
        result, resource = outcome = await reconciler.finalize(raw, retry)
        if status := _report(reconciler, raw, outcome, started):
            patch.setdefault("status", {}).update(status)
        if not result.release_finalizer:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after or 5.0)
        scheduler.untrack(resource.uid)

    async def on_resync(
        body: Mapping[str, Any], outcome: tuple[Result, Resource], started: float
    ) -> None:
        """Report one resync pass: Events, metrics, the status patch (inside its lock)."""
        raw = dict(body)
        resource = outcome[1]
        scheduler.track(resource)  # where it lives, as this pass placed it
        if status := _report(reconciler, raw, outcome, started):
            await reconciler.in_thread(
                reconciler.kube.patch_status,
                resource.kind,
                resource.namespace,
                resource.name,
                status,
            )

    async def on_drain(type: str | None, body: Any, **_: Any) -> None:
        """The sharder moves this resource to another replica: once no pass of it is in
        flight (its lock) and its resync is forgotten, give it up (both labels removed)."""
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if shards is None or type == "DELETED" or sharding.DRAIN_LABEL not in labels:
            return
        if labels.get(sharding.SHARD_LABEL) != settings.shard_name:
            return
        uid, kind = str(meta["uid"]), str(body.get("kind", ""))
        loop, delay = asyncio.get_running_loop(), 0.5
        plural = next(k.plural for k in KINDS if k.kind == kind)
        while True:
            async with reconciler.locks[uid]:
                scheduler.untrack(uid)
                try:
                    await loop.run_in_executor(
                        shards.executor,
                        shards.release,
                        plural,
                        meta["namespace"],
                        meta["name"],
                        uid,
                    )
                    break
                except KubeError as exc:
                    if exc.status in (404, 409):
                        break  # gone, or not the same object any more
                    log.warning(
                        "handing over %s %s/%s: %s", kind, meta["namespace"], meta["name"], exc
                    )
                except Exception as exc:  # noqa: BLE001 - tried again below
                    log.warning(
                        "handing over %s %s/%s: %s", kind, meta["namespace"], meta["name"], exc
                    )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
        reconciler.forget(uid)
        metrics.CONDITIONS.forget(uid)
        log.info("%s %s/%s handed over to another replica", kind, meta["namespace"], meta["name"])

    def owned(body: Mapping[str, Any]) -> bool:
        return not handed_over(body)

    scheduler = ResyncScheduler(
        reconciler, settings, on_resync, priority, owns=owned if shards is not None else None
    )
    if reconciler.directory is not None:
        _register_accounts(registry, reconciler, settings, scheduler, aws)

    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.login(registry=registry)(login)
    for kind in KINDS:
        plural = kind.plural
        kw: dict[str, Any] = {"registry": registry}
        kopf.on.resume(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.create(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.update(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.delete(GROUP, VERSION, plural, id="finalize", **kw)(on_delete)
        if shards is not None:
            kopf.on.event(GROUP, VERSION, plural, id=HANDOVER, **kw)(on_drain)
    logging.getLogger("kopf.objects").addFilter(_quiet_watches)


ACCOUNT_WATCH, NAMESPACE_WATCH = "cloudaccount-watch", "namespace-watch"


HANDOVER = "handover"


def _quiet_watches(record: logging.LogRecord) -> bool:
    """kopf logs "Handler '...' succeeded." at INFO for every watch event of every namespace
    and CloudAccount, and (sharded) of every resource: nothing anyone reads. Failures are
    kept."""
    message = record.getMessage()
    return not (
        message.endswith("succeeded.")
        and any(f"'{name}'" in message for name in (ACCOUNT_WATCH, NAMESPACE_WATCH, HANDOVER))
    )


def _register_accounts(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    settings: Settings,
    scheduler: ResyncScheduler,
    aws: Aws | None,
) -> None:
    directory = reconciler.directory
    assert directory is not None
    kube = reconciler.kube

    manage = settings.manages_accounts and aws is not None

    async def assess(raw: dict[str, Any]) -> dict[str, Any]:
        """The status patch saying whether AssumeRole works ({} when nothing changed)."""
        assert aws is not None
        account = accounts.CloudAccount.from_body(raw)
        try:
            session = await reconciler.in_thread(aws.sessions.session, account.ref)
        except errors.AccountUnavailableError as exc:
            ready = cond.Condition(cond.READY, False, cond.ACCOUNT_UNAVAILABLE, str(exc))
            fields: dict[str, Any] = {}
        else:
            ready = cond.Condition(
                cond.READY, True, "RoleAssumed", f"assumed {session.assumed_arn}"
            )
            fields = {"assumedArn": session.assumed_arn}
        return cond.status_patch(raw.get("status") or {}, [ready], account.generation, fields)

    async def check(raw: dict[str, Any]) -> None:
        """Ready when AssumeRole works, with the identity it gave: at each change (from the
        watch, so that a spec edited back to the last one handled is checked too) and every
        30 s (a session is cached: that costs an AssumeRole only when a failure is retried)."""
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            if update := await assess(raw):
                await reconciler.in_thread(
                    kube.request,
                    "PATCH",
                    f"/apis/{ACCOUNTS_API_VERSION}/{accounts.PLURAL}/{raw['metadata']['name']}/status",
                    {"status": update},
                    content_type="application/merge-patch+json",
                )
        except Exception as exc:  # noqa: BLE001 - the 30-second check tries again
            log.warning("checking CloudAccount %s failed: %s", raw["metadata"]["name"], exc)

    async def on_account_event(type: str | None, body: Any, **_: Any) -> None:
        name = str(body["metadata"]["name"])
        if type == "DELETED":
            directory.account_gone(name)
            changed = True
        else:
            raw = plain(body)
            before, now = directory.account_seen(raw)
            changed = before != now
            if before is not None and before.ref != now.ref and aws is not None:
                aws.sessions.forget(name)  # its role changed: assume the new one
            if changed and manage:
                await check(raw)
        if changed:
            affected = reconciler.affected(account=name)
            if affected:
                log.info("CloudAccount %s changed: rechecking %d resources", name, len(affected))
                scheduler.recheck(affected)

    async def on_namespace_event(type: str | None, body: Any, **_: Any) -> None:
        name = str(body["metadata"]["name"])
        if type == "DELETED":
            directory.namespace_gone(name)
            return
        before, now = directory.namespace_seen(plain(body))
        if before is not None and before != now:
            affected = reconciler.affected(namespace=name)
            if affected:
                log.info("namespace %s changed: rechecking %d resources", name, len(affected))
                scheduler.recheck(affected)

    kopf.on.event(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, id=ACCOUNT_WATCH, registry=registry)(
        on_account_event
    )
    kopf.on.event("", "v1", "namespaces", id=NAMESPACE_WATCH, registry=registry)(on_namespace_event)
    if not manage or aws is None:
        return
    sessions = aws.sessions

    async def check_periodically(body: Any, **_: Any) -> None:
        await check(plain(body))

    async def release_account(body: Any, retry: int, **_: Any) -> None:
        """Deleting a CloudAccount waits until no resource lives in it or waits for it."""
        raw = plain(body)
        name = str(raw["metadata"]["name"])
        users = await reconciler.in_thread(account_users, kube, name)
        if users:
            more = f" and {len(users) - 10} more" if len(users) > 10 else ""
            shown = ", ".join(users[:10]) + more
            message = f"deletion waits: {len(users)} resources use CloudAccount {name}: {shown}"
            reconciler.post_event(raw | {"kind": accounts.KIND}, Event("Warning", "InUse", message))
            raise kopf.TemporaryError(message, delay=min(30.0, 5.0 * (retry + 1)))
        sessions.forget(name)

    kopf.on.delete(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, id="release", registry=registry)(
        release_account
    )
    kopf.timer(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, interval=30, registry=registry)(
        check_periodically
    )
