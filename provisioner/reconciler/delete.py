"""Stage: delete. The deletion policy, access revoked first, then the cloud resource until
the cloud says NotFound, then the Secret; the finalizer goes only then. A paused resource
waits, unless its namespace is being deleted."""

from __future__ import annotations

from provisioner.aws import errors
from provisioner.crashpoints import crashpoint
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ExternalClient, LeftoverRemover
from provisioner.kube.client import Kube
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused, pinned
from provisioner.reconciler import guardrails, ownership
from provisioner.reconciler.converge import record
from provisioner.reconciler.grants import Grants
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.outcome import WAIT_BASE, WAIT_CAP, Event, Result, Verdict, backoff
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.secret import ConnectionSecret
from provisioner.reconciler.workers import Workers

# A deletion held by a pause or by the cloud looks again at most this often.
HELD_CAP = 15.0


class Deletion:
    def __init__(
        self,
        kube: Kube,
        clients: dict[str, ExternalClient],
        workers: Workers,
        placement: Placement,
        observer: Observer,
        secret: ConnectionSecret,
        grants: Grants,
    ) -> None:
        self.kube = kube
        self.clients = clients
        self.workers = workers
        self.placement = placement
        self.observer = observer
        self.secret = secret
        self.grants = grants

    async def delete(self, resource: Resource, retry: int) -> Result:
        done = Result(release_finalizer=True, for_generation=False)
        if resource.paused:
            held = await self._held_by_pause(resource, retry, done)
            if held is not None:
                return held
        if kinds.descriptor(resource.kind).deletion_protected(resource.spec):
            if pinned(resource.status) or await self._made(resource):
                return _protected(resource, retry)
        access = self.grants.held(resource)
        if resource.deletion_policy == "Retain" and access is None:
            return await self._retain(resource, done)
        try:
            resource = await self.placement.place(resource, deleting=True)
        except AccountRefused:
            if pinned(resource.status):
                raise
            # Never placed, so nothing was ever created: nothing to delete anywhere.
            await self.secret.delete(resource)
            return done
        if access is not None:
            # Access goes first, whatever happens to the resource itself.
            done.events += await self.grants.revoke(resource, access)
        if resource.deletion_policy == "Retain":
            return await self._retain(resource, done)
        return await self._delete_in_cloud(resource, retry, done)

    async def _made(self, resource: Resource) -> bool:
        """Whether a resource that was never pinned (refused before any create, plan-only,
        or its status lost) has a cloud resource of ours to protect: nothing there, and it
        is not held. A pinned one is held without a look."""
        try:
            placed = await self.placement.place(resource, deleting=True)
        except AccountRefused:
            if pinned(resource.status):
                raise
            return False
        obs = await self.observer.observe_plainly(placed)
        return obs.exists and ownership.is_ours(placed, obs)

    async def _held_by_pause(self, resource: Resource, retry: int, done: Result) -> Result | None:
        """A paused resource's deletion waits; in a namespace being deleted, it goes on."""
        terminating = await self.workers.in_thread(
            guardrails.namespace_terminating, self.kube, resource.namespace
        )
        if not terminating:
            paused = guardrails.paused(resource)
            paused.conditions.insert(
                0,
                cond.Condition(
                    cond.READY,
                    False,
                    cond.DELETING,
                    "deletion waits until the resource is unpaused (or its namespace is deleted)",
                ),
            )
            paused.requeue_after = backoff(retry, WAIT_BASE, HELD_CAP)
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
        return None

    async def _delete_in_cloud(self, resource: Resource, retry: int, done: Result) -> Result:
        name = resource.external_name
        client = self.clients[resource.kind]
        obs = await self.observer.observe_plainly(resource)
        if obs.exists and not ownership.is_ours(resource, obs):
            await self.secret.delete(resource)
            done.events.append(
                Event(
                    "Warning",
                    "LeftUntouched",
                    f"{name} is not ours; the cloud resource was not deleted",
                )
            )
            return done
        if obs.exists and not obs.deleting:
            keys = kinds.descriptor(resource.kind).recorded_status
            await record(self.kube, self.workers, resource, obs, keys)
            try:
                await self.workers.write(resource.uid, client.delete, resource, obs)
                crashpoint("after-delete-call")
            except errors.DeletionBlocked as exc:
                return _deleting(exc.message, backoff(retry, WAIT_BASE, HELD_CAP))
            obs = await self.observer.observe_plainly(resource)
        if obs.exists:
            message = f"deleting {name} ({obs.state or 'in progress'})"
            return _deleting(message, backoff(retry, WAIT_BASE, WAIT_CAP))
        if isinstance(client, LeftoverRemover):
            waiting = await self.workers.write(resource.uid, client.remove_leftovers, resource, obs)
            if waiting:
                return _deleting(waiting, backoff(retry, WAIT_BASE, WAIT_CAP))
        await self.secret.delete(resource)
        done.events.append(Event("Normal", "Deleted", f"deleted {resource.kind} {name}"))
        return done

    async def _retain(self, resource: Resource, done: Result) -> Result:
        await self.secret.delete(resource)
        done.events.append(
            Event(
                "Normal",
                "Retained",
                f"{resource.external_name} retained by deletionPolicy Retain",
            )
        )
        return done


def _protected(resource: Resource, retry: int) -> Result:
    """spec.deletionProtection holds the deletion (where the admission policy that refuses
    the delete is not installed) until it is set to false."""
    message = (
        f"spec.deletionProtection is true: {resource.external_name} is not deleted; turn it "
        f"off to delete it (kubectl patch {resource.kind.lower()} {resource.name} -n "
        f'{resource.namespace} --type=merge -p \'{{"spec":{{"deletionProtection":false}}}}\'), '
        f"then deletionPolicy {resource.deletion_policy} applies"
    )
    use = resource.class_use
    if use is not None and "deletionProtection" in use.fields:
        message = (
            f"spec.deletionProtection is true, set by ResourceClass {use.name}: "
            f"{resource.external_name} is not deleted until the class no longer sets it (or, "
            "where the class does not enforce it, the resource sets it to false), then "
            f"deletionPolicy {resource.deletion_policy} applies"
        )
    synced = cond.Condition(cond.SYNCED, False, cond.DELETION_PROTECTED, message)
    result = Result(
        conditions=[cond.Condition(cond.READY, False, cond.DELETING, message), synced],
        for_generation=False,
        requeue_after=backoff(retry, WAIT_BASE, HELD_CAP),
        verdict=Verdict.WAITING,
    )
    if cond.changed(resource.status, synced):
        result.events.append(Event("Warning", cond.DELETION_PROTECTED, message))
    return result


def _deleting(message: str, delay: float) -> Result:
    return Result(
        conditions=[cond.Condition(cond.READY, False, cond.DELETING, message)],
        for_generation=False,
        requeue_after=delay,
        verdict=Verdict.WAITING,
    )
