"""Stage: dependencies. The ARNs of the resources a resource needs (a Queue's dead-letter
target), once they are Ready and in the same account; until then, the pass waits."""

from __future__ import annotations

import dataclasses

from provisioner.kube.client import Kube
from provisioner.model import conditions as cond
from provisioner.model.resource import Dependency, Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler.outcome import WAIT_BASE, WAIT_CAP, Result, Verdict, backoff, where
from provisioner.reconciler.workers import Workers


class Dependencies:
    def __init__(self, kube: Kube, workers: Workers) -> None:
        self.kube = kube
        self.workers = workers

    async def resolve(self, resource: Resource, retry: int) -> Resource | Result:
        """The resource with its dependencies' ARNs, or the Result that says it waits."""
        resolved: dict[str, str] = {}
        for dependency in needed(resource):
            found = await self.ready_arn(resource.namespace, dependency)
            if found is None:
                return waiting_for(dependency, retry)
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
        return dataclasses.replace(resource, resolved=resolved)

    async def ready_arn(self, namespace: str, dependency: Dependency) -> tuple[str, str] | None:
        """The dependency's ARN and CloudAccount name ("" for the operator's own) once it is
        Ready; None while it is not (or is going away)."""
        target = await self.workers.in_thread(
            self.kube.get_resource, dependency.kind, namespace, dependency.name
        )
        if not target or target.get("metadata", {}).get("deletionTimestamp"):
            return None
        status = target.get("status") or {}
        if not cond.is_true(status, cond.READY) or not status.get("arn"):
            return None
        return str(status["arn"]), str(status.get("account") or "")


def needed(resource: Resource) -> list[Dependency]:
    """The dependencies a pass waits for (one needed only to create: until it exists)."""
    made = bool(resource.status.get("arn"))
    return [d for d in resource.dependencies if not (d.until_created and made)]


def waiting_for(dependency: Dependency, retry: int) -> Result:
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
        verdict=Verdict.WAITING,
    )
