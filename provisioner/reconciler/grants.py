"""Stage: access. The grants of spec.access once the resource serves (status.access, their
Events, the problem a grant waits on), and their revocation first thing on deletion."""

from __future__ import annotations

from provisioner.access.grants import Access
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Event
from provisioner.reconciler.progress import Progress


class Grants:
    def __init__(self) -> None:
        # Set by whoever runs spec.access; None: no grants are made, a resource that asks
        # for some is told.
        self.access: Access | None = None

    async def grant(self, p: Progress, arns: list[str]) -> tuple[cond.Condition | None, bool]:
        """The problem a grant waits on (None: none), and whether it may go away by itself
        (a ServiceAccount not created yet) rather than wait for people (a conflict)."""
        if self.access is None:
            return None, False
        granted = await self.access.converge(p.resource, arns)
        if granted is None:
            return None, False
        p.fields["access"] = granted.entries
        p.events += [Event(*e) for e in granted.events]
        return granted.problem, granted.retry

    def held(self, resource: Resource) -> Access | None:
        """The grants to revoke: only what status.access holds (it records each grant
        before anything is made for it)."""
        return self.access if resource.status.get("access") else None

    async def revoke(self, resource: Resource, access: Access) -> list[Event]:
        return [Event(*e) for e in await access.revoke_all(resource)]
