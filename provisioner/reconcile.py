"""The generic reconciler: one code path for every kind.

observe -> (create | update) -> wait until available -> connection Secret -> status,
and on deletion: deletion policy -> wait for NotFound -> Secret -> release.

Every entry point takes the resource's lock, so the change handlers and the periodic
resync never act on one resource at once. The outcome of a pass is a `Result`; the
caller turns it into one status patch (nothing when nothing changed), the Events of
the state changes, and a requeue delay when the pass must be repeated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from provisioner import annotations, secrets
from provisioner import conditions as cond
from provisioner.cloud import errors
from provisioner.cloud.base import ExternalClient, Observation
from provisioner.config import Settings
from provisioner.crashpoints import crashpoint
from provisioner.kube import Kube, KubeError
from provisioner.models import Dependency, Resource

T = TypeVar("T")
log = logging.getLogger(__name__)

# Requeue delays (seconds): the first retry is quick, then it doubles up to the cap.
RETRY_BASE = 1.0
RETRY_CAP = 60.0
CREDENTIALS_RETRY_CAP = 300.0
WAIT_BASE = 2.0
WAIT_CAP = 30.0


def backoff(retry: int, base: float = RETRY_BASE, cap: float = RETRY_CAP) -> float:
    """Exponential backoff with +-20% jitter so that many resources spread out."""
    delay = min(cap, base * (2 ** min(retry, 16)))
    return round(delay * random.uniform(0.8, 1.2), 2)


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Result:
    """What one pass decided: conditions, status fields, Events, and whether to come back."""

    conditions: list[cond.Condition] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # Whether this pass acted on the current generation (sets observedGeneration).
    observed: bool = True
    # Deletion finished: the finalizer may go.
    released: bool = False

    @property
    def retry_message(self) -> str:
        for c in self.conditions:
            if not c.status:
                return f"{c.reason}: {c.message}"
        return "requeued"


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        clients: dict[str, ExternalClient],
        post_event: Callable[[dict[str, Any], Event], None],
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.clients = clients
        self.post_event = post_event
        self.executor = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="cloud")
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # Passes in flight at once. A burst of 1,000 new resources then finishes in waves
        # (each one quickly) instead of all together at the end, holding far less memory.
        self.gate = asyncio.Semaphore(max(1, settings.workers))
        # Master passwords of databases created by this process whose Secret is not
        # written yet. Lost on a crash, which is fine: a database found without its
        # Secret gets a new password (set in the cloud first, then written).
        self.pending_passwords: dict[str, str] = {}

    # -- helpers ------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    def resource(self, body: dict[str, Any]) -> Resource:
        return Resource.from_body(
            body, region=self.settings.region, cluster_id=self.settings.cluster_id
        )

    def forget(self, uid: str) -> None:
        self.locks.pop(uid, None)
        self.pending_passwords.pop(uid, None)

    @staticmethod
    def _is_ours(resource: Resource, obs: Observation) -> bool:
        if obs.owned_by(resource):
            return True
        if obs.owner_uid:
            return False  # another owner's, whatever the annotations say
        # No owner tag at all, but our own status recorded this name before the create
        # call: an earlier create of ours was interrupted before its tags were written.
        if resource.status.get("externalName") == resource.external_name:
            return True
        return Reconciler._adopting(resource, obs)

    @staticmethod
    def _adopting(resource: Resource, obs: Observation) -> bool:
        """Asked to take over an untagged resource named explicitly in the spec."""
        return obs.exists and not obs.owner_uid and resource.adopt and resource.explicit_name

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

    def status_patch(self, resource: Resource, result: Result) -> dict[str, Any]:
        return cond.status_patch(
            resource.status,
            result.conditions,
            resource.generation if result.observed else None,
            result.fields,
        )

    def emit(self, body: dict[str, Any], resource: Resource, result: Result) -> None:
        """Post the Result's own Events plus one per state change of a condition.

        Synced=True is news only when it recovers from False; Ready changes always are.
        """
        for event in result.events:
            self.post_event(body, event)
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
            quiet = c.status or c.reason in (
                cond.CREATING,
                cond.DELETING,
                cond.WAITING_FOR_DEPENDENCY,
            )
            self.post_event(
                body, Event("Normal" if quiet else "Warning", c.reason, c.message or c.reason)
            )

    # -- entry points ---------------------------------------------------------------

    async def reconcile(self, body: dict[str, Any], retry: int = 0) -> tuple[Result, Resource]:
        """A pass for a new generation, a resume, or an annotation change."""
        resource = self.resource(body)
        async with self.gate, self.locks[resource.uid]:
            if resource.paused:
                return self._paused(resource), resource
            requested = resource.reconcile_request_pending
            if self.terminal_for_generation(resource) and not requested:
                return Result(observed=False), resource
            try:
                result = await self._sync(resource, retry)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a condition
                result = self._failure(resource, exc, retry)
            if requested:
                result.fields["lastReconcileRequest"] = resource.annotation(
                    annotations.RECONCILE_REQUESTED_AT
                )
            return result, resource

    async def resync(self, body: dict[str, Any]) -> tuple[Result, Resource] | None:
        """The periodic re-check: drift, vanished resources, edited or deleted Secrets."""
        resource = self.resource(body)
        if resource.paused or not self.settled(resource):
            return None
        async with self.gate, self.locks[resource.uid]:
            try:
                result = await self._sync(resource, 0, resync=True)
            except Exception as exc:  # noqa: BLE001
                result = self._failure(resource, exc, 0)
            result.requeue_after = None
            return result, resource

    @staticmethod
    def _paused(resource: Resource) -> Result:
        return Result(
            conditions=[
                cond.Condition(
                    cond.SYNCED,
                    False,
                    cond.PAUSED,
                    f"paused by the {annotations.PAUSED} annotation: no cloud calls until it is "
                    "removed or set to false",
                )
            ],
            observed=False,
        )

    async def finalize(self, body: dict[str, Any], retry: int = 0) -> tuple[Result, Resource]:
        resource = self.resource(body)
        async with self.gate, self.locks[resource.uid]:
            try:
                result = await self._delete(resource, retry)
            except errors.NotSupportedError as exc:
                # The endpoint has no such service, so nothing of ours can exist there.
                await self._delete_secret(resource)
                result = Result(released=True, observed=False)
                result.events.append(Event("Normal", "Deleted", f"nothing to delete: {exc}"))
            except Exception as exc:  # noqa: BLE001
                result = self._failure(resource, exc, retry, deleting=True)
        if result.released:
            self.forget(resource.uid)
        return result, resource

    # -- the passes -------------------------------------------------------------------

    async def _sync(self, resource: Resource, retry: int, resync: bool = False) -> Result:
        client = self.clients[resource.kind]
        name = resource.external_name
        resolved: dict[str, str] = {}
        for dependency in resource.dependencies:
            arn = await self._ready_arn(resource.namespace, dependency)
            if arn is None:
                return self._waiting_for(dependency, retry)
            resolved[dependency.key] = arn
        resource = dataclasses.replace(resource, resolved=resolved)

        events: list[Event] = []
        conditions: list[cond.Condition] = []
        obs = await self.run(client.observe, resource)
        if obs.exists and not self._is_ours(resource, obs):
            return self._name_conflict(resource, obs)

        if not obs.exists:
            if not client.tags_on_create and resource.status.get("externalName") != name:
                # Recorded before the call: the proof that an untagged resource of this
                # name is our own interrupted create (S3 tags only after CreateBucket).
                await self.run(
                    self.kube.patch_status,
                    resource.kind,
                    resource.namespace,
                    resource.name,
                    {"externalName": name},
                )
                resource.status["externalName"] = name
            elif resync:
                events.append(
                    Event(
                        "Warning", "Vanished", f"{name} disappeared from the cloud; recreating it"
                    )
                )
            create_secrets: dict[str, str] = {}
            if client.generates_password:
                password = self.pending_passwords.setdefault(
                    resource.uid, secrets.generate_password()
                )
                create_secrets["password"] = password
            try:
                await self.run(client.create, resource, create_secrets)
            except errors.ConflictError:
                # An earlier attempt may have succeeded with its answer lost on the way
                # back: "already exists" is ours if the tags say so.
                obs = await self.run(client.observe, resource)
                if not (obs.exists and self._is_ours(resource, obs)):
                    raise
            crashpoint("after-create")
            events.append(Event("Normal", "Created", f"created {resource.kind} {name}"))
            obs = await self.run(client.observe, resource)
            if not obs.exists:
                return Result(
                    conditions=[
                        cond.Condition(cond.READY, False, cond.CREATING, f"creating {name}")
                    ],
                    fields={"externalName": name},
                    events=events,
                    requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
                )
        elif obs.diffs and obs.available:
            adopting = self._adopting(resource, obs)
            drift = "; ".join(d.describe() for d in obs.diffs)
            if adopting:
                events.append(Event("Normal", "Adopted", f"took over existing {name}"))
            if resync and resource.drift_report_only and not adopting:
                conditions.append(cond.Condition(cond.DRIFTED, True, cond.DRIFT_REPORTED, drift))
                if cond.changed(resource.status, conditions[-1]):
                    events.append(
                        Event("Warning", "Drifted", f"not corrected (report only): {drift}")
                    )
            else:
                await self.run(client.update, resource, obs)
                if resync and not adopting:
                    conditions.append(
                        cond.Condition(cond.DRIFTED, False, cond.DRIFT_CORRECTED, drift)
                    )
                    events.append(Event("Warning", "Drifted", f"corrected: {drift}"))
                else:
                    changed = ", ".join(d.field for d in obs.diffs)
                    events.append(Event("Normal", "Updated", f"updated {changed}"))
                obs = await self.run(client.observe, resource)
        elif resync and cond.is_true(resource.status, cond.DRIFTED):
            conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))

        fields = {"externalName": name, "arn": obs.arn, **obs.status}
        if obs.deleting or not obs.available:
            reason = cond.CREATING if obs.state in ("creating", "") else cond.UNAVAILABLE
            return Result(
                conditions=[
                    cond.Condition(
                        cond.READY, False, reason, f"{name} is {obs.state or 'not ready'}"
                    ),
                    cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
                    *conditions,
                ],
                fields=fields,
                events=events,
                requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
            )
        if obs.diffs and not (resync and resource.drift_report_only):
            pending = "; ".join(d.describe() for d in obs.diffs)
            return Result(
                conditions=[
                    cond.Condition(cond.READY, True, cond.AVAILABLE, f"{name} is available"),
                    cond.Condition(
                        cond.SYNCED,
                        False,
                        cond.RECONCILE_ERROR,
                        f"the cloud has not applied: {pending}",
                    ),
                    *conditions,
                ],
                fields=fields,
                events=events,
                requeue_after=backoff(retry),
            )

        secret_events, secret_fields = await self._write_secret(resource, client, obs)
        events.extend(secret_events)
        fields.update(secret_fields)
        fields["connectionSecret"] = resource.secret_name
        available = f"{name} is available; connection Secret {resource.secret_name} is written"
        return Result(
            conditions=[
                cond.Condition(cond.READY, True, cond.AVAILABLE, available),
                cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
                *conditions,
            ],
            fields=fields,
            events=events,
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
        self, resource: Resource, client: ExternalClient, obs: Observation
    ) -> tuple[list[Event], dict[str, Any]]:
        """Write the connection Secret if its content differs; for databases, own the password.

        Password order: the cloud first, then the Secret, then status. A crash after the
        cloud accepted a new password leaves the rotation (or the missing Secret) pending,
        so the next pass sets yet another password and writes that one: the Secret always
        ends with the password the cloud accepted last.
        """
        events: list[Event] = []
        fields: dict[str, Any] = {}
        existing = await self.run(self.kube.get_secret, resource.namespace, resource.secret_name)
        data = dict(obs.connection)
        if client.generates_password:
            owned = existing is not None and secrets.owned_by(existing, resource)
            current = secrets.decode(existing) if owned else {}
            password = current.get("password") or self.pending_passwords.get(resource.uid)
            rotate = resource.rotation_pending
            if rotate or not password:
                # Rotation asked, or nobody knows the password any more (Secret deleted,
                # adopted instance, crash between create and Secret): a new one, cloud first.
                password = secrets.generate_password()
                await self.run(client.set_password, resource, password)
                crashpoint("after-password-set")
                what = "rotated on request" if rotate else "reset: the Secret had none"
                events.append(Event("Normal", "PasswordChanged", f"master password {what}"))
                if rotate:
                    fields["lastPasswordRotation"] = resource.annotation(
                        annotations.ROTATE_PASSWORD_AT
                    )
            data = client.with_password(data, password)
        if secrets.needs_write(existing, resource, data):
            body = secrets.build(resource, data)
            if existing is None:
                await self.run(self.kube.create_secret, resource.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                await self.run(
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
        return events, fields

    async def _ready_arn(self, namespace: str, dependency: Dependency) -> str | None:
        """The dependency's ARN once it is Ready; None while it is not (or is going away)."""
        target = await self.run(self.kube.get_resource, dependency.kind, namespace, dependency.name)
        if not target or target.get("metadata", {}).get("deletionTimestamp"):
            return None
        status = target.get("status") or {}
        if not cond.is_true(status, cond.READY) or not status.get("arn"):
            return None
        return str(status["arn"])

    def _name_conflict(self, resource: Resource, obs: Observation) -> Result:
        owner = f"owned by {obs.owner_uid}" if obs.owner_uid else "not created by this operator"
        message = (
            f"{resource.external_name} already exists in the cloud and is {owner}; "
            "it is left untouched: choose another name"
        )
        return Result(
            conditions=[
                cond.Condition(cond.READY, False, cond.UNAVAILABLE, "the cloud name is taken"),
                cond.Condition(cond.SYNCED, False, cond.NAME_CONFLICT, message),
            ],
        )

    async def _delete(self, resource: Resource, retry: int) -> Result:
        name = resource.external_name
        done = Result(released=True, observed=False)
        if resource.paused:
            paused = self._paused(resource)
            paused.conditions.insert(
                0,
                cond.Condition(
                    cond.READY,
                    False,
                    cond.DELETING,
                    "deletion waits until the resource is unpaused",
                ),
            )
            paused.requeue_after = backoff(retry, WAIT_BASE, 15.0)
            return paused
        if resource.deletion_policy == "Retain":
            await self._delete_secret(resource)
            done.events.append(
                Event("Normal", "Retained", f"{name} retained by deletionPolicy Retain")
            )
            return done
        client = self.clients[resource.kind]
        obs = await self.run(client.observe, resource)
        if obs.exists and not self._is_ours(resource, obs):
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
                await self.run(client.delete, resource, obs)
                crashpoint("after-delete-call")
            except errors.DeletionBlocked as exc:
                return Result(
                    conditions=[cond.Condition(cond.READY, False, cond.DELETING, exc.message)],
                    observed=False,
                    requeue_after=backoff(retry, WAIT_BASE, 15.0),
                )
            obs = await self.run(client.observe, resource)
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
                observed=False,
                requeue_after=backoff(retry, WAIT_BASE, WAIT_CAP),
            )
        await self._delete_secret(resource)
        done.events.append(Event("Normal", "Deleted", f"deleted {resource.kind} {name}"))
        return done

    async def _delete_secret(self, resource: Resource) -> None:
        existing = await self.run(self.kube.get_secret, resource.namespace, resource.secret_name)
        if existing and secrets.owned_by(existing, resource):
            await self.run(
                self.kube.delete_secret,
                resource.namespace,
                resource.secret_name,
                existing["metadata"]["uid"],
            )

    def _failure(
        self, resource: Resource, exc: Exception, retry: int, deleting: bool = False
    ) -> Result:
        """Map a failure to conditions and a requeue; the message never holds a secret value."""
        if isinstance(exc, errors.TerminalError):
            message = (
                str(exc)
                if isinstance(exc, errors.NotSupportedError)
                else f"the cloud refused the spec: {exc}"
            )
            return Result(
                conditions=[
                    cond.Condition(
                        cond.READY, False, cond.DELETING if deleting else cond.UNAVAILABLE, message
                    ),
                    cond.Condition(cond.SYNCED, False, cond.INVALID_SPEC, message),
                ],
                # The name the cloud was asked for, so that kubectl shows what was refused.
                fields={} if deleting else {"externalName": resource.external_name},
                # During deletion there is no spec change to wait for: keep retrying slowly.
                requeue_after=backoff(retry, cap=CREDENTIALS_RETRY_CAP) if deleting else None,
                observed=not deleting,
            )
        if isinstance(exc, errors.ConflictError):
            return Result(
                conditions=[
                    cond.Condition(cond.READY, False, cond.UNAVAILABLE, "the cloud name is taken"),
                    cond.Condition(cond.SYNCED, False, cond.NAME_CONFLICT, str(exc)),
                ],
                requeue_after=backoff(retry) if deleting else None,
            )
        delay = backoff(retry)
        if isinstance(exc, secrets.SecretConflict):
            message = str(exc)
        elif isinstance(exc, errors.CredentialsError):
            message = str(exc)
            delay = backoff(retry, cap=CREDENTIALS_RETRY_CAP)
        elif isinstance(exc, errors.CloudError):
            message = f"cloud call failed, will retry: {exc}"
        elif isinstance(exc, KubeError):
            message = f"Kubernetes API call failed, will retry: {exc}"
        else:
            log.exception("unexpected error reconciling %s %s", resource.kind, resource.ref)
            message = f"unexpected error, will retry: {type(exc).__name__}"
        conditions = [cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, message)]
        if deleting:
            conditions.insert(0, cond.Condition(cond.READY, False, cond.DELETING, message))
        return Result(conditions=conditions, requeue_after=delay, observed=not deleting)
