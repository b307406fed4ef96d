"""Stage: guardrails. What keeps a pass from acting: the paused annotation, a generation
already refused for good, a namespace on its way out (which overrides a pause)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.kube.client import Kube, KubeError
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Result, Verdict


def paused(resource: Resource) -> Result:
    """A paused resource: no cloud call at all, until it is unpaused."""
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
        verdict=Verdict.PAUSED,
    )


def terminal_for_generation(resource: Resource) -> bool:
    """The current generation was refused for good by an earlier pass (as status says)."""
    synced = cond.find(resource.status.get("conditions"), cond.SYNCED)
    return bool(
        synced
        and synced.get("status") == "False"
        and synced.get("reason") in cond.REFUSED_FOR_GENERATION
        and synced.get("observedGeneration") == resource.generation
    )


def settled(resource: Resource) -> bool:
    """The change handlers are done with the current generation and it succeeded."""
    synced = cond.find(resource.status.get("conditions"), cond.SYNCED)
    return bool(
        synced
        and synced.get("status") == "True"
        and resource.status.get("observedGeneration") == resource.generation
    )


def at_rest(resource: Resource, body: Mapping[str, Any]) -> bool:
    """Nothing asks for a pass now: the current generation was handled and is Ready and
    Synced, no request (reconcile, password rotation) waits, the resource is neither
    paused nor being deleted. A resume after a restart finds most resources like this;
    their next look at the cloud is the periodic resync."""
    return bool(
        settled(resource)
        and cond.is_true(resource.status, cond.READY)
        and not resource.paused
        and not resource.reconcile_request_pending
        and not resource.rotation_pending
        and not (body.get("metadata") or {}).get("deletionTimestamp")
    )


def namespace_terminating(kube: Kube, namespace: str) -> bool:
    """Whether the namespace is being deleted: a paused resource in it is deleted then,
    so that the namespace (and a CloudAccount waiting for its resources) can go. False
    where the operator may not read namespaces."""
    try:
        found = kube.get_namespace(namespace)
    except KubeError:
        return False
    meta, status = (found or {}).get("metadata") or {}, (found or {}).get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"
