"""kopf's set-up: its settings and storages, its session with the API server, the wait for
the CRDs at start-up, and plain copies of the bodies it hands to the handlers.

kopf keeps its bookkeeping (handler progress, last-handled spec) in `status.kopf`,
so a pass that finishes writes a single status patch and no annotations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import kopf

from provisioner import ACCOUNTS_API_VERSION, API_VERSION, FINALIZER, GROUP
from provisioner.config import Settings
from provisioner.kinds.registry import KINDS
from provisioner.kube import login as kubelogin
from provisioner.model import schema_defaults
from provisioner.placement import accounts
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.fair_slots import FairSlots, fair_requests, fair_workers
from provisioner.runtime import sharding

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


class HubDiffBaseStorage(kopf.StatusDiffBaseStorage):
    """kopf's last-handled configuration, read at the version the operator watches.

    One stored by an operator that watched v1alpha1 spells fields the old way, and one
    stored by an earlier release lacks the fields added since with a default; compared as
    it is with a body read now, every resource would look changed after an upgrade.
    The sharding labels are no part of it: a resource handed to another replica is resumed
    there, not taken for changed.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return _without_shard_labels(super().build(body=body, extra_fields=extra_fields))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        essence = super().fetch(body=body)
        if essence is None:
            return None
        converted = schema_defaults.last_handled_at_hub(essence, str(body.get("kind", "")))
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
