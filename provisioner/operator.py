"""kopf registration: the same handler set for every kind.

- create / update / resume -> Reconciler.reconcile (status merged into kopf's own patch)
- delete                   -> Reconciler.finalize (kopf holds our finalizer until it returns)
- a daemon per resource    -> Reconciler.resync every `resync_seconds` (+-10% jitter)

kopf keeps its bookkeeping (handler progress, last-handled spec) in `status.kopf`,
so a pass that finishes writes a single status patch and no annotations.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import kopf

from provisioner import FINALIZER, GROUP, VERSION
from provisioner.config import Settings
from provisioner.kube import PLURALS
from provisioner.reconcile import Event, Reconciler, Result

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """A deep, plain-dict copy of a kopf body view (kopf's views are read-only and live)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def post_event(body: dict[str, Any], event: Event) -> None:
    kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    kopf_settings.persistence.finalizer = FINALIZER
    kopf_settings.persistence.progress_storage = kopf.StatusProgressStorage(
        field="status.kopf.progress"
    )
    kopf_settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
        field="status.kopf.lastHandledConfiguration"
    )
    kopf_settings.posting.reporting_component = "provisioner"
    kopf_settings.posting.level = logging.INFO
    kopf_settings.scanning.disabled = True
    kopf_settings.watching.server_timeout = 300
    kopf_settings.watching.client_timeout = 330
    kopf_settings.watching.connect_timeout = 10
    kopf_settings.networking.connect_timeout = 10
    kopf_settings.networking.request_timeout = 60
    kopf_settings.batching.worker_limit = settings.workers
    kopf_settings.batching.idle_timeout = 30
    kopf_settings.background.cancellation_polling = 5
    if settings.peering:
        kopf_settings.peering.name = settings.peering
        kopf_settings.peering.standalone = False
        kopf_settings.peering.mandatory = True
        kopf_settings.peering.clusterwide = not settings.namespaces
        kopf_settings.peering.lifetime = settings.peering_lifetime
        kopf_settings.peering.priority = (
            settings.peering_priority
            if settings.peering_priority is not None
            else random.randint(1, 2**30)
        )
    else:
        kopf_settings.peering.standalone = True


def _apply(
    patch: kopf.Patch, reconciler: Reconciler, body: dict[str, Any], result_and_resource: tuple
) -> Result:
    result, resource = result_and_resource
    status = reconciler.status_patch(resource, result)
    if status:
        patch.setdefault("status", {}).update(status)
    reconciler.emit(body, resource, result)
    return result


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, settings: Settings) -> None:
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, reconciler.settings)

    kopf.on.startup(registry=registry)(startup)
    kopf.on.login(registry=registry)(kopf.login_via_client)

    async def on_change(body: Any, patch: kopf.Patch, retry: int, **_: Any) -> None:
        raw = plain(body)
        result = _apply(patch, reconciler, raw, await reconciler.reconcile(raw, retry))
        if result.requeue_after is not None:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after)

    async def on_delete(body: Any, patch: kopf.Patch, retry: int, **_: Any) -> None:
        raw = plain(body)
        result = _apply(patch, reconciler, raw, await reconciler.finalize(raw, retry))
        if not result.released:
            raise kopf.TemporaryError(result.retry_message, delay=result.requeue_after or 5.0)

    async def resync_loop(body: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            await stopped.wait(settings.resync_seconds * random.uniform(0.9, 1.1))
            if stopped:
                return
            raw = plain(body)
            if raw.get("metadata", {}).get("deletionTimestamp"):
                return
            outcome = await reconciler.resync(raw)
            if outcome is None:
                continue
            result, resource = outcome
            status = reconciler.status_patch(resource, result)
            if status:
                await reconciler.run(
                    reconciler.kube.patch_status,
                    resource.kind,
                    resource.namespace,
                    resource.name,
                    status,
                )
            reconciler.emit(raw, resource, result)

    for plural in PLURALS.values():
        kw: dict[str, Any] = {"registry": registry}
        kopf.on.resume(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.create(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.update(GROUP, VERSION, plural, id="reconcile", **kw)(on_change)
        kopf.on.delete(GROUP, VERSION, plural, id="finalize", **kw)(on_delete)
        kopf.daemon(GROUP, VERSION, plural, id="resync", cancellation_timeout=5.0, **kw)(
            resync_loop
        )
