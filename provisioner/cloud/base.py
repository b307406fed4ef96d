"""The per-kind contract that the generic reconciler drives.

Each kind implements observe / create / update / delete against one AWS service.
All the hard shared semantics (finalizers, ownership, conditions, Secrets, backoff)
live in the reconciler; a client only speaks to its cloud service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.models import OWNER_UID_TAG, Resource


@dataclass(frozen=True)
class FieldDiff:
    """One field whose cloud value differs from the spec."""

    field: str
    observed: Any
    desired: Any

    def describe(self) -> str:
        return f"{self.field}: {self.observed!r} -> {self.desired!r}"


@dataclass
class Observation:
    """What the cloud says about the resource right now."""

    exists: bool
    # The owner-uid tag found on the resource ("" if the resource carries none).
    owner_uid: str = ""
    # Usable right now (an RDS instance is `available`, a bucket or queue always is).
    available: bool = True
    # Going away (RDS `deleting`); the reconciler waits for NotFound.
    deleting: bool = False
    # The cloud's own state word, for conditions and Events (`creating`, `available`, ...).
    state: str = ""
    arn: str = ""
    # Fields that differ from the spec; empty means up to date.
    diffs: list[FieldDiff] = field(default_factory=list)
    # Connection Secret values the cloud knows (never a password).
    connection: dict[str, str] = field(default_factory=dict)
    # Extra status fields for this kind (`endpoint`, `queueUrl`).
    status: dict[str, str] = field(default_factory=dict)
    # Free-form facts a client keeps between observe and update (raw attributes, tags).
    raw: dict[str, Any] = field(default_factory=dict)

    def owned_by(self, resource: Resource) -> bool:
        return self.owner_uid == resource.uid


class ExternalClient(Protocol):
    """One small client per kind; every method is synchronous and idempotent."""

    kind: str
    # Whether create() tags in the same call. If not, the reconciler records the name in
    # status before creating, so that an untagged resource of that name is known as ours.
    tags_on_create: bool
    # Kinds with a master password the operator generates (RDS) also implement
    # set_password and with_password; for the others those are never called.
    generates_password: bool

    def observe(self, resource: Resource) -> Observation:
        """Describe the cloud resource named `resource.external_name`.

        Returns Observation(exists=False) when it does not exist. Raises a
        `provisioner.cloud.errors.CloudError` subclass for anything else.
        """

    def create(self, resource: Resource, secrets: dict[str, str]) -> None:
        """Create the resource with the ownership tags in the same call where the API allows.

        `secrets` carries generated secret values (the DB master password).
        """

    def update(self, resource: Resource, observation: Observation) -> None:
        """Bring every mutable field and the tags in line with the spec."""

    def delete(self, resource: Resource, observation: Observation) -> None:
        """Start or finish deletion following `resource.deletion_policy`.

        Idempotent: the reconciler calls observe again and waits for exists=False.
        `Retain` never reaches a client. Raises `DeletionBlocked` when the cloud
        refuses for a reason the user must fix (a bucket that still holds objects).
        """

    def set_password(self, resource: Resource, password: str) -> None:
        """Set a new master password (only kinds that have one)."""

    def with_password(self, connection: dict[str, str], password: str) -> dict[str, str]:
        """The connection Secret's values with the password (only kinds that have one)."""


def owner_of(tags: dict[str, str]) -> str:
    return tags.get(OWNER_UID_TAG, "")
