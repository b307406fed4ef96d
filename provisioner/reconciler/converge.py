"""Stage: converge. Create the cloud resource when it does not exist (safe to repeat after
a crash), write the requested changes, and correct drift or only report it."""

from __future__ import annotations

from provisioner.aws import errors
from provisioner.crashpoints import crashpoint
from provisioner.kinds.contract import ExternalClient, FieldDiff, Observation, PasswordClient
from provisioner.kube.client import Kube
from provisioner.model import conditions as cond
from provisioner.model import connection_secret
from provisioner.model.resource import Resource
from provisioner.reconciler import ownership
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import EVERYTHING_REQUESTED
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers


async def record(
    kube: Kube, workers: Workers, resource: Resource, obs: Observation, keys: tuple[str, ...]
) -> None:
    """Write to status, right before a call that may make or remove something beyond the
    resource itself, the fields of `obs.status` that record it (its kind's
    `recorded_status`), when they differ from what status holds."""
    before = {k: obs.status.get(k) for k in keys if resource.status.get(k) != obs.status.get(k)}
    if not before:
        return
    await workers.in_thread(
        kube.patch_status, resource.kind, resource.namespace, resource.name, before
    )
    resource.status.update(before)


def from_class(resource: Resource, field: str) -> str:
    """A diff's field as Events and conditions name it: with the ResourceClass it came from."""
    use = resource.class_use
    return f"{field} (from ResourceClass {use.name})" if use and use.names(field) else field


class Converge:
    def __init__(
        self,
        kube: Kube,
        workers: Workers,
        observer: Observer,
        placement: Placement,
        states: States,
    ) -> None:
        self.kube = kube
        self.workers = workers
        self.observer = observer
        self.placement = placement
        self.states = states

    async def create(
        self, p: Progress, client: ExternalClient, absent: Observation | None = None
    ) -> Observation:
        """Create the cloud resource and observe it again. What the look that found it
        absent records in status (`recorded_status`: what the create makes beyond it) is
        written first."""
        resource = p.resource
        name = resource.external_name
        unnamed = await self._pin(resource, client)
        if absent is not None:
            keys = tuple(k for k in p.kind.recorded_status if k in absent.status)
            await record(self.kube, self.workers, resource, absent, keys)
        if p.resync and not unnamed:
            p.event("Warning", "Vanished", f"{name} disappeared from the cloud; recreating it")
        create_secrets: dict[str, str] = {}
        if isinstance(client, PasswordClient):
            state = self.states.of(resource.uid)
            if state.pending_password is None:
                state.pending_password = connection_secret.generate_password()
            create_secrets["password"] = state.pending_password
        known: Observation | None = None
        try:
            known = await self.workers.write(resource.uid, client.create, resource, create_secrets)
        except errors.ConflictError:
            # An earlier attempt may have succeeded with its answer lost on the way
            # back: "already exists" is ours if the tags say so.
            obs = await self.observer.observe(resource)
            if not (obs.exists and ownership.is_ours(resource, obs)):
                raise
        finally:
            if isinstance(client, PasswordClient) and "password" not in create_secrets:
                # Made without it (a restore carries its snapshot's password): the Secret
                # stage sets a new one in the cloud before any Secret holds it.
                self.states.of(resource.uid).pending_password = None
        crashpoint("after-create")
        p.event("Normal", "Created", f"created {resource.kind} {name}")
        return known if known is not None else await self.observer.observe(resource)

    async def _pin(self, resource: Resource, client: ExternalClient) -> bool:
        """Record in status, before the call, what a crash right after it must not lose:
        the account and region (a resource never moves, even if its namespace's default
        account changes meanwhile) and, for a kind that tags only after creating (S3), the
        name and the create token that prove an untagged resource of that name our own.
        Returns whether the create is such an untagged one."""
        token = ownership.create_token(resource)
        unnamed = not client.tags_on_create and resource.status.get("createToken") != token
        unplaced = self.placement.unplaced(resource)
        if unnamed or unplaced:
            before = (
                await self.workers.in_thread(self.placement.fields, resource) if unplaced else {}
            )
            if unnamed:
                before.update(externalName=resource.external_name, createToken=token)
            await self.workers.in_thread(
                self.kube.patch_status, resource.kind, resource.namespace, resource.name, before
            )
            resource.status.update(before)
        return unnamed

    async def apply_changes(
        self, p: Progress, client: ExternalClient, obs: Observation
    ) -> Observation:
        """Write the requested changes and correct drift (or only report it); observe again."""
        resource = p.resource
        requested = p.requested
        if ownership.adopting(resource, obs):
            # Taking over: the spec wins on every field, and that is no drift.
            p.event("Normal", "Adopted", f"took over existing {resource.external_name}")
            requested = EVERYTHING_REQUESTED
        asked = p.kind.requests
        changes = [d for d in obs.diffs if requested.covers(d.field) or d.field in asked]
        drift = [d for d in obs.diffs if not (requested.covers(d.field) or d.field in asked)]
        to_write = changes if resource.drift_report_only else changes + drift
        self._report_drift(p, drift)
        if not to_write:
            return obs
        await record(self.kube, self.workers, resource, obs, p.kind.recorded_status)
        await self.workers.write(resource.uid, client.update, resource, obs, to_write)
        handled = {asked[d.field]: d.desired for d in to_write if d.field in asked}
        if handled:  # done: not again for this value, even after a restart
            await self.workers.in_thread(
                self.kube.patch_status, resource.kind, resource.namespace, resource.name, handled
            )
            resource.status.update(handled)
        self.observer.remember_writes(resource, to_write, p.kind.settle_seconds)
        if changes:
            updated = ", ".join(from_class(resource, d.field) for d in changes)
            p.event("Normal", "Updated", f"updated {updated}")
        return await self.observer.observe(resource)

    @staticmethod
    def _report_drift(p: Progress, drift: list[FieldDiff]) -> None:
        resource = p.resource
        described = "; ".join(
            from_class(resource, d.field) + d.describe()[len(d.field) :] for d in drift
        )
        if drift and resource.drift_report_only:
            drifted = cond.Condition(cond.DRIFTED, True, cond.DRIFT_REPORTED, described)
            p.conditions.append(drifted)
            if cond.changed(resource.status, drifted):
                p.event("Warning", "Drifted", f"not corrected (report only): {described}")
        elif drift:
            p.conditions.append(
                cond.Condition(cond.DRIFTED, False, cond.DRIFT_CORRECTED, described)
            )
            p.event("Warning", "Drifted", f"corrected: {described}")
        elif cond.is_true(resource.status, cond.DRIFTED):
            p.conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))
