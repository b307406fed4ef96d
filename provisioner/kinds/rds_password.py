"""DatabaseInstance: who keeps the master password (`spec.masterPassword`).

`managedBy: Operator` (the default): the operator generates the password and keeps it in the
connection Secret only. `managedBy: SecretsManager`: RDS generates it and keeps it in a secret
of its own in Secrets Manager (CreateDBInstance / ModifyDBInstance `ManageMasterUserPassword`,
https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-secrets-manager.html); the
connection Secret then carries that secret's ARN (`passwordSecretArn`) and no password, and
`spec.access` grants reading that secret only (and decrypting with its key, when one is named).

Switching either way is a ModifyDBInstance: to SecretsManager with `ManageMasterUserPassword`
(RDS makes a new password; the Secret stops carrying the old one before the call), back to
Operator with `ManageMasterUserPassword: false` and a fresh password, which the connection
Secret receives in the same pass (or, after a crash, a newer one set again: the Secret never
holds a password the cloud did not take last).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provisioner.crashpoints import crashpoint
from provisioner.kinds.contract import FieldDiff, Observation, levels
from provisioner.model import connection_secret
from provisioner.model.resource import Resource

if TYPE_CHECKING:
    from provisioner.aws.session import Aws

OPERATOR, SECRETS_MANAGER = "Operator", "SecretsManager"
FIELD = "spec.masterPassword.managedBy"
# The connection Secret's value naming the secret that holds the password.
SECRET_ARN = "passwordSecretArn"  # noqa: S105 - a key name, no secret
STATUS = "masterUserSecret"

# spec.access on a DatabaseInstance: reading its master user secret (and, with a key of the
# user's, decrypting it: https://docs.aws.amazon.com/secretsmanager/latest/userguide/
# security-encryption.html). Only `read`: RDS owns the secret and writes it.
ACCESS = levels(
    read=("secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret", "kms:Decrypt"),
    write=(),
    admin=(),
)


@dataclass(frozen=True)
class PasswordSpec:
    managed_by: str = OPERATOR
    kms_key_id: str | None = None

    @property
    def managed(self) -> bool:
        return self.managed_by == SECRETS_MANAGER

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> PasswordSpec:
        raw = spec.get("masterPassword") or {}
        return cls(
            managed_by=str(raw.get("managedBy") or OPERATOR),
            kms_key_id=raw.get("kmsKeyId") or None,
        )


def create_params(spec: PasswordSpec, secrets: Mapping[str, str]) -> dict[str, Any]:
    """CreateDBInstance's password parameters."""
    if not spec.managed:
        return {"MasterUserPassword": secrets["password"]}
    return {"ManageMasterUserPassword": True, **_kms(spec)}


def switch_params(spec: PasswordSpec, password: str) -> dict[str, Any]:
    """ModifyDBInstance's parameters switching the instance to `spec`'s keeper; `password`
    is the operator's new one when switching back to it."""
    if spec.managed:
        return {"ManageMasterUserPassword": True, **_kms(spec)}
    return {"ManageMasterUserPassword": False, "MasterUserPassword": password}


def _kms(spec: PasswordSpec) -> dict[str, str]:
    # The key is chosen when RDS makes the secret; while it keeps it, the key cannot change
    # (ModifyDBInstance, MasterUserSecretKmsKeyId: https://docs.aws.amazon.com/AmazonRDS/
    # latest/APIReference/API_ModifyDBInstance.html), which the CRD's CEL rule holds to.
    return {"MasterUserSecretKmsKeyId": spec.kms_key_id} if spec.kms_key_id else {}


def secret_of(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The instance's MasterUserSecret ({} when the operator keeps its password)."""
    found = instance.get("MasterUserSecret") or {}
    return dict(found) if found.get("SecretArn") else {}


def keeper(instance: Mapping[str, Any]) -> str:
    return SECRETS_MANAGER if secret_of(instance) else OPERATOR


def diffs(spec: PasswordSpec, instance: Mapping[str, Any]) -> list[FieldDiff]:
    observed = keeper(instance)
    return [] if observed == spec.managed_by else [FieldDiff(FIELD, observed, spec.managed_by)]


def connection(instance: Mapping[str, Any]) -> dict[str, str]:
    """The connection Secret's `passwordSecretArn` when Secrets Manager keeps the password."""
    secret = secret_of(instance)
    return {SECRET_ARN: str(secret["SecretArn"])} if secret else {}


def status(instance: Mapping[str, Any]) -> dict[str, Any]:
    """status.masterUserSecret: the secret, its state and key (None removes it)."""
    secret = secret_of(instance)
    if not secret:
        return {STATUS: None}
    shown = {
        "arn": secret.get("SecretArn"),
        "status": secret.get("SecretStatus"),
        "kmsKeyId": secret.get("KmsKeyId"),
    }
    return {STATUS: {k: str(v) for k, v in shown.items() if v}}


def access_arns(resource: Resource, observation: Observation) -> list[str]:
    """What spec.access grants on: the master user secret, and its KMS key when the spec
    names one (the default key, aws/secretsmanager, needs no grant). [] while there is none."""
    secret = observation.status.get(STATUS) or {}
    if not secret.get("arn"):
        return []
    key = str(secret.get("kmsKeyId") or "")
    named = resource.spec.master_password.kms_key_id is not None
    return [str(secret["arn"])] + ([key] if named and key.startswith("arn:") else [])


def cloud_keeps(resource: Resource, observation: Observation) -> bool:
    """Whether the connection Secret must carry no password: the spec asks Secrets Manager
    to keep it, or it keeps it now (a switch back not made yet, or drift only reported)."""
    return bool(resource.spec.master_password.managed or observation.status.get(STATUS))


def handing_to_cloud(resource: Resource, observation: Observation) -> bool:
    """The spec asks Secrets Manager to keep the password and it does not yet."""
    return bool(resource.spec.master_password.managed and not observation.status.get(STATUS))


class Handover:
    """The passwords of the switches back to the operator this process made, until the
    connection Secret takes them (lost in a crash: the Secret stage then sets a new one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passwords: dict[str, str] = {}

    @staticmethod
    def prepare(spec: PasswordSpec, switch: FieldDiff | None, params: dict[str, Any]) -> str | None:
        """Add a switch's parameters to a ModifyDBInstance's `params`; the new password a
        switch back to the operator sets (None: none)."""
        if switch is None:
            return None
        password = None if spec.managed else connection_secret.generate_password()
        params.update(switch_params(spec, password or ""))
        return password

    def made(self, uid: str, password: str | None, switch: FieldDiff | None) -> None:
        """The cloud took the ModifyDBInstance `prepare` added `switch` (None: none) to, and
        with it `password` (None: nothing to hand over)."""
        if switch is None:
            return
        if password is not None:
            with self._lock:
                self._passwords[uid] = password
        crashpoint("after-password-switch")  # the connection Secret not written yet

    def take(self, uid: str) -> str | None:
        with self._lock:
            return self._passwords.pop(uid, None)


class KeptPassword:
    """RdsClient's side of a password Secrets Manager keeps (`CloudKeptPasswordClient`)."""

    aws: Aws
    handover: Handover

    def _rds(self, resource: Resource) -> Any:
        raise NotImplementedError  # RdsClient's

    def cloud_keeps(self, resource: Resource, observation: Observation) -> bool:
        return cloud_keeps(resource, observation)

    def handing_to_cloud(self, resource: Resource, observation: Observation) -> bool:
        return handing_to_cloud(resource, observation)

    def handed_back(self, resource: Resource) -> str | None:
        return self.handover.take(resource.uid)

    def rotate_kept(self, resource: Resource) -> None:
        """RDS rotates the secret it keeps at once (RotateMasterUserPassword, "valid only if
        the master user password is managed by RDS in Secrets Manager": https://docs.aws.
        amazon.com/AmazonRDS/latest/APIReference/API_ModifyDBInstance.html)."""
        self.aws.call(
            self._rds(resource).modify_db_instance,
            DBInstanceIdentifier=resource.external_name,
            RotateMasterUserPassword=True,
            ApplyImmediately=True,
        )
