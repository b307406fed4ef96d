"""Stage: the connection Secret. Written when its content differs; for a kind whose client
owns a password (a database), the password too.

Password order: the cloud first, then the Secret, then status. A crash after the cloud
accepted a new password leaves the rotation (or the missing Secret) pending, so the next
pass sets yet another password and writes that one: the Secret always ends with the
password the cloud accepted last.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from provisioner.aws import errors
from provisioner.crashpoints import crashpoint
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import (
    CloudKeptPasswordClient,
    ExternalClient,
    Observation,
    PasswordClient,
)
from provisioner.kube.client import Kube, valid_name
from provisioner.model import annotations as annotation_keys
from provisioner.model import connection_secret, v1beta1_rules
from provisioner.model.resource import Resource
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers


class ConnectionSecret:
    def __init__(self, kube: Kube, workers: Workers, states: States) -> None:
        self.kube = kube
        self.workers = workers
        self.states = states

    async def write(self, p: Progress, client: ExternalClient, obs: Observation) -> None:
        """Write the Secret if its content differs (status fields go to `p.fields`)."""
        resource = p.resource
        existing = await self.workers.in_thread(
            self.kube.get_secret, resource.namespace, resource.secret_name
        )
        owned = existing is not None and connection_secret.owned_by(existing, resource)
        if existing is not None and not owned:
            # Refused before any password change: a password set in the cloud but never
            # written would be known to nobody, and set anew at every retry.
            connection_secret.needs_write(existing, resource, {})  # raises SecretConflict
        data = dict(obs.connection)
        password: str | None = None
        if isinstance(client, CloudKeptPasswordClient) and client.cloud_keeps(resource, obs):
            # The cloud keeps the password: the Secret says where (the kind's connection
            # values), never what; a rotation is the cloud's, once it keeps one.
            if not client.handing_to_cloud(resource, obs):
                await self._rotate_kept(p, client)
        elif isinstance(client, PasswordClient):
            stored = (
                connection_secret.stored_password(
                    existing, resource.secret_keys, partial(client.with_password, data)
                )
                if owned and existing
                else None
            )
            shared = await self._source_password(resource)
            if shared and resource.rotation_pending:
                p.event(
                    "Warning",
                    "RotationIgnored",
                    "a read replica has its source's password: rotate the source's instead",
                )
                p.fields["lastPasswordRotation"] = resource.annotation(
                    annotation_keys.ROTATE_PASSWORD_AT
                )
            password = shared or await self._password(p, client, stored)
            data = client.with_password(data, password)
        if resource.secret_keys:
            # A value the kind offers that this resource has none of now (kmsKeyId without a
            # KMS key) fills its placeholders with "": only the default key set leaves it out.
            data = dict.fromkeys(v1beta1_rules.VALUES.get(resource.kind, ()), "") | data
        try:
            data = connection_secret.render(resource.secret_keys, data)
        except connection_secret.TemplateError as exc:
            raise errors.NotSupportedError(str(exc)) from None
        if connection_secret.needs_write(existing, resource, data, password):
            await self._put(resource, existing, connection_secret.build(resource, data, password))
            if existing is not None or resource.status.get("connectionSecret"):
                p.event(
                    "Normal",
                    "SecretWritten",
                    f"connection Secret {resource.secret_name} restored or updated",
                )
        self.states.of(resource.uid).pending_password = None
        p.fields["connectionSecret"] = resource.secret_name

    async def _password(self, p: Progress, client: PasswordClient, stored: str | None) -> str:
        """The password the Secret holds: the one stored, the one this process created the
        database with, or a new one set in the cloud first."""
        resource = p.resource
        handed_back = (
            client.handed_back(resource) if isinstance(client, CloudKeptPasswordClient) else None
        )
        password = handed_back or stored or self.states.of(resource.uid).pending_password
        rotate = resource.rotation_pending
        if password and not rotate:
            return password
        # Rotation asked, or nobody knows the password any more (Secret deleted, adopted
        # instance, crash between create and Secret): a new one, cloud first.
        password = connection_secret.generate_password()
        await self.workers.write(resource.uid, client.set_password, resource, password)
        crashpoint("after-password-set")
        what = "rotated on request" if rotate else "reset: the Secret had none"
        p.event("Normal", "PasswordChanged", f"master password {what}")
        if rotate:
            p.fields["lastPasswordRotation"] = resource.annotation(
                annotation_keys.ROTATE_PASSWORD_AT
            )
        return password

    async def _source_password(self, resource: Resource) -> str | None:
        """The password a read replica's Secret carries: its source's, read from the source's
        own connection Secret (in the same namespace); None for any other resource."""
        source = next((d for d in resource.dependencies if d.credentials), None)
        if source is None:
            return None
        body = await self.workers.in_thread(
            self.kube.get_resource, source.kind, resource.namespace, source.name
        )
        found = None
        if body:
            body.setdefault("kind", source.kind)
            owner = kinds.parse(body, region=resource.region, cluster_id=resource.cluster_id)
            secret = await self.workers.in_thread(
                self.kube.get_secret, resource.namespace, owner.secret_name
            )
            if secret and connection_secret.owned_by(secret, owner):
                found = connection_secret.stored_password(secret, owner.secret_keys)
        if not found:
            raise errors.RetryableError(
                f"the connection Secret of {source.role} {source.name} holds no password "
                "the operator can read yet"
            )
        return found

    async def before_changes(self, p: Progress, client: ExternalClient, obs: Observation) -> None:
        """Before changes that give the master password to the cloud (RDS then makes a new
        one), the Secret stops carrying the one it holds: no Secret claims a password the
        cloud no longer takes, even when the process dies right after the change."""
        if isinstance(client, CloudKeptPasswordClient) and client.handing_to_cloud(p.resource, obs):
            await self.write(p, client, obs)

    async def _rotate_kept(self, p: Progress, client: CloudKeptPasswordClient) -> None:
        """The rotation annotation, for a password the cloud keeps: the cloud rotates it."""
        resource = p.resource
        if not resource.rotation_pending:
            return
        await self.workers.write(resource.uid, client.rotate_kept, resource)
        crashpoint("after-rotate-kept")
        p.event("Normal", "PasswordChanged", "master password rotation asked of the cloud")
        p.fields["lastPasswordRotation"] = resource.annotation(annotation_keys.ROTATE_PASSWORD_AT)

    async def _put(
        self, resource: Resource, existing: dict[str, Any] | None, body: dict[str, Any]
    ) -> None:
        if existing is None:
            await self.workers.in_thread(self.kube.create_secret, resource.namespace, body)
            return
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        await self.workers.in_thread(
            self.kube.replace_secret, resource.namespace, resource.secret_name, body
        )

    async def delete(self, resource: Resource) -> None:
        """Delete the Secret if it is this resource's own."""
        if not valid_name(resource.secret_name):
            return  # no Secret can have that name: there is none to delete
        existing = await self.workers.in_thread(
            self.kube.get_secret, resource.namespace, resource.secret_name
        )
        if existing and connection_secret.owned_by(existing, resource):
            await self.workers.in_thread(
                self.kube.delete_secret,
                resource.namespace,
                resource.secret_name,
                existing["metadata"]["uid"],
            )
