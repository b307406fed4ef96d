"""The per-kind contract that the generic reconciler drives.

Each kind implements observe / create / update / delete against one AWS service, and
describes itself once in a `KindDescriptor` in its own module. All the hard shared
semantics (finalizers, ownership, conditions, Secrets, backoff) live in the reconciler;
a client only speaks to its cloud service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from provisioner.aws.errors import ErrorCodes
from provisioner.model.resource import CLUSTER_TAG, OWNER_UID_TAG, Dependency, Resource

if TYPE_CHECKING:
    from provisioner.aws.session import Aws
    from provisioner.model.account import AccountRef


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
    # The namespace the resource's owner allows to adopt it (its `ADOPTABLE_BY_TAG`).
    adoptable_by: str = ""
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
    # Extra status fields for this kind (`endpoint`, `queueUrl`, a bucket's `notifications`);
    # None removes one.
    status: dict[str, Any] = field(default_factory=dict)
    # What the client read and needs again in update or delete (a queue's URL, the tags it
    # found), so that those calls do not read it a second time. Only the client reads it.
    client_state: dict[str, Any] = field(default_factory=dict)
    # Fields just written that the cloud may still show with their previous value (set by
    # the reconciler, never by a client).
    settling: list[str] = field(default_factory=list)
    # What the cloud is still applying while the resource serves (RDS's pending modified
    # values), for Ready's message; "" when nothing.
    applying: str = ""

    def owned_by(self, resource: Resource) -> bool:
        return self.owner_uid == resource.uid


class ExternalClient(Protocol):
    """One small client per kind; every method is synchronous and idempotent."""

    # Whether create() tags in the same call. If not, the reconciler records the name in
    # status before creating, so that an untagged resource of that name is known as ours.
    tags_on_create: bool

    def observe(self, resource: Resource) -> Observation:
        """Describe the cloud resource named `resource.external_name`.

        Returns Observation(exists=False) when it does not exist. Raises a
        `provisioner.aws.errors.CloudError` subclass for anything else.
        """

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation | None:
        """Create the resource with the ownership tags in the same call where the API allows.

        `secrets` carries generated secret values (a master password, for kinds that have one).
        Returns the resource as it now is when the client knows it without another call (the
        create's own answer, or exactly what it just wrote), so that nothing is read whose
        answer is already known; None has the reconciler observe it.
        """

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        """Set exactly the fields in `diffs` (taken from `observation.diffs`) as desired."""

    def delete(self, resource: Resource, observation: Observation) -> None:
        """Start or finish deletion following `resource.deletion_policy`.

        Idempotent: the reconciler calls observe again and waits for exists=False.
        `Retain` never reaches a client. Raises `DeletionBlocked` when the cloud
        refuses for a reason the user must fix (a bucket that still holds objects).
        """


@runtime_checkable
class PasswordClient(Protocol):
    """The capability of kinds with a master password the operator generates and owns (RDS)."""

    def set_password(self, resource: Resource, password: str) -> None:
        """Set a new master password in the cloud."""

    def with_password(self, connection: dict[str, str], password: str) -> dict[str, str]:
        """The connection Secret's values with the password (and anything built from it)."""


@runtime_checkable
class LeftoverRemover(Protocol):
    """The capability of kinds that make cloud resources for one resource alone that can go
    only after it (RDS: the instance's DB subnet group and DB parameter group, which AWS lets
    go only once no instance uses them), recorded in status (`KindDescriptor.recorded_status`)
    before they are made."""

    def remove_leftovers(self, resource: Resource, observation: Observation) -> str:
        """Once the cloud says the resource is gone (`observation`, exists=False, carries
        what is recorded): delete those that are still there. Idempotent. Returns "" when
        nothing is left, else why the deletion still waits."""


@runtime_checkable
class CloudKeptPasswordClient(Protocol):
    """The capability of kinds whose master password the cloud may keep instead of the
    operator (RDS with Secrets Manager): the connection Secret then carries no password."""

    def cloud_keeps(self, resource: Resource, observation: Observation) -> bool:
        """Whether the connection Secret must carry no password now."""

    def handing_to_cloud(self, resource: Resource, observation: Observation) -> bool:
        """Whether the pending changes give the password to the cloud (the Secret must stop
        carrying it before they are written)."""

    def handed_back(self, resource: Resource) -> str | None:
        """The password a switch back to the operator just set (None: none known)."""

    def rotate_kept(self, resource: Resource) -> None:
        """Ask the cloud to rotate the password it keeps."""


@runtime_checkable
class BatchObserver(Protocol):
    """The capability of kinds whose cloud describes many resources in one call (RDS: one
    DescribeDBInstances for up to 100 identifiers). The periodic resync then observes the
    resources that come due together with one call per batch instead of one each."""

    def describe_many(
        self, region: str, names: Sequence[str], account: AccountRef | None = None
    ) -> dict[str, Any]:
        """What the cloud says about those of `names` that exist in `account` (None: the
        operator's own), by name (absent: unknown, the caller observes that one by itself)."""

    def observed(self, resource: Resource, described: Any) -> Observation:
        """The observation `observe` would make from `describe_many`'s answer for it."""


@runtime_checkable
class BatchTagReader(Protocol):
    """The capability of kinds whose tags the Resource Groups Tagging API reads for many
    resources in one call (SQS, SNS, S3: one GetResources for up to 100 ARNs,
    `provisioner.kinds.tagging`). The periodic resync then reads the tags of the resources
    that come due together with one call per batch; each look makes the rest of its reads
    (a queue's attributes, ...) by itself."""

    def tags_many(
        self, region: str, names: Sequence[str], account: AccountRef | None = None
    ) -> dict[str, dict[str, str]]:
        """The tags of those of `names` the tagging API knows, by name (absent: untagged,
        not there, or not known yet; that look reads its tags by itself)."""

    def observe_tagged(self, resource: Resource, tags: dict[str, str]) -> Observation:
        """`observe`, with `tags` (from `tags_many`) standing in for the resource's own tag
        read when they show it ours and tagged as desired; otherwise it reads them itself."""


@dataclass(frozen=True)
class OwnedResource:
    """A cloud resource found by listing, with its tags (for `provisioner leaks`)."""

    kind: str
    name: str
    tags: dict[str, str]

    @property
    def owner_uid(self) -> str:
        return self.tags.get(OWNER_UID_TAG, "")

    @property
    def cluster(self) -> str:
        return self.tags.get(CLUSTER_TAG, "")


def no_dependencies(spec: Any) -> list[Dependency]:
    return []


@dataclass(frozen=True)
class KindDescriptor:
    """Everything the rest of the operator needs to know about one kind.

    The registry (`provisioner.kinds.registry.KINDS`) lists one per kind; handler registration,
    models, error classification, leaks, RBAC and the tooling all iterate it.
    """

    kind: str
    plural: str
    short_names: tuple[str, ...]
    # The AWS service its client speaks to (botocore's name: "rds", "s3", "sqs", "sns").
    service: str
    parse_spec: Callable[[Mapping[str, Any]], Any]
    default_deletion_policy: str
    # The spec field that names the cloud resource explicitly (its value or "" when unset).
    name_field: str
    # The deterministic cloud name derived from (namespace, name, uid, parsed spec).
    derive_name: Callable[[str, str, str, Any], str]
    client: Callable[[Aws], ExternalClient]
    # Every cloud resource of this kind in one region, with tags (for `provisioner leaks`).
    list_resources: Callable[[Aws, str], Iterable[OwnedResource]]
    error_codes: ErrorCodes = field(default_factory=ErrorCodes)
    # Other custom resources that must be Ready first (a Queue's dead-letter target).
    dependencies: Callable[[Any], list[Dependency]] = no_dependencies
    # Offered by LocalStack's free edition (the operator's LocalStack tests run these).
    on_localstack: bool = True
    # How long reads may still show a field's previous value after a write (SQS: "up to 60
    # seconds" after SetQueueAttributes). Within it, a read that shows the old value of a
    # field just written is neither written again nor reported as drift.
    settle_seconds: float = 0.0
    # The state words of a resource that exists but is still being made: Ready=False
    # Creating (any other word while it does not serve: Unavailable). "" is a state not
    # known yet.
    creating_states: frozenset[str] = frozenset({""})
    # `spec.access`: the IAM actions each level grants (cumulative: `write` holds `read`'s),
    # on the resources `access_resources` derives from the cloud resource's ARN. Empty: the
    # kind offers no `spec.access`.
    access_actions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    access_resources: Callable[[str], list[str]] = lambda arn: [arn]
    # The ARNs the grants are on, from the resource as observed: its own (the default), or
    # what the kind grants instead (a database: its master user secret and that secret's
    # KMS key); [] while there is nothing to grant on yet.
    access_arns: Callable[[Resource, Observation], list[str]] = lambda resource, obs: [obs.arn]
    # Whether the spec protects the resource from deletion (RDS: spec.deletionProtection):
    # the finalizer then holds whatever the deletion policy, until the spec says otherwise.
    deletion_protected: Callable[[Any], bool] = lambda spec: False
    # `Observation.status` fields that record what `update` and `delete` make beyond the
    # resource itself (a bucket's statements in the policies of its notification targets).
    # The reconciler writes them to status right before those calls whenever they differ
    # from it, so that a crash during a call leaves the record for the next pass to find.
    recorded_status: tuple[str, ...] = ()
    # Diffs that an annotation asks for (RDS `reboot`: reboot-requested-at), by FieldDiff
    # field, with the status field that records the value handled. They are requested changes
    # whatever the drift policy, done once per value: the reconciler records the value right
    # after the client's update call has done it.
    requests: Mapping[str, str] = field(default_factory=dict)
    # What plan-only adds to a create's description (a restore's source, a replica's): ", ...".
    describe_create: Callable[[Resource], str] = lambda resource: ""


def levels(
    read: tuple[str, ...], write: tuple[str, ...], admin: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """The actions of the three access levels, each holding the ones below it."""
    return {"read": read, "write": read + write, "admin": read + write + admin}


def owner_of(tags: dict[str, str]) -> str:
    return tags.get(OWNER_UID_TAG, "")


# Set on an untagged cloud resource by whoever owns it in the cloud, naming the one
# namespace whose resources may adopt it (the `adopt` annotation alone never suffices).
ADOPTABLE_BY_TAG = "provisioner.dev/adoptable-by"


def adoptable_by(tags: dict[str, str]) -> str:
    return tags.get(ADOPTABLE_BY_TAG, "")
