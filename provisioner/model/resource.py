"""Typed views of the custom resources, parsed once at the edge.

The API server has already applied the CRD defaults and validation; the kind's own
spec parser (in its `KindDescriptor`) turns the raw spec into an object, and this module
fills the few defaults that depend on the operator's configuration (region) or on the
object itself (derived names).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from provisioner.model import annotations as annotation_keys
from provisioner.model import conversion
from provisioner.model.classes import ClassRefused, ClassUse

if TYPE_CHECKING:
    from provisioner.model.account import AccountRef

OWNER_UID_TAG = "provisioner.dev/owner-uid"
NAMESPACE_TAG = "provisioner.dev/namespace"
NAME_TAG = "provisioner.dev/name"
CLUSTER_TAG = "provisioner.dev/cluster"
OWNERSHIP_TAG_KEYS = (OWNER_UID_TAG, NAMESPACE_TAG, NAME_TAG, CLUSTER_TAG)

# Kubernetes: an object's name is at most 253 characters (a DNS-1123 subdomain), a label
# value at most 63 and begins and ends with a letter or digit.
MAX_NAME = 253
MAX_LABEL_VALUE = 63
SECRET_SUFFIX = "-connection"  # noqa: S105 - a name's suffix
# The hex digits of SHA-256 that stand for what a shortened name or value leaves out.
SHORT_HASH = 8


class SpecParser(Protocol):
    """What a kind tells the model about its spec (the kind contract's `KindDescriptor`
    keeps it; the model needs nothing else of a kind)."""

    @property
    def kind(self) -> str: ...
    @property
    def name_field(self) -> str: ...
    @property
    def default_deletion_policy(self) -> str: ...
    def parse_spec(self, raw: Mapping[str, Any], /) -> Any: ...
    def derive_name(self, namespace: str, name: str, uid: str, spec: Any, /) -> str: ...
    def dependencies(self, spec: Any, /) -> list[Dependency]: ...


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:SHORT_HASH]


def _shortened(text: str, room: int, suffix: str) -> str:
    """The first characters of `text` that fit in `room` with `-<hash of text>` and `suffix`
    after them, ending with a letter or digit."""
    keep = room - 1 - SHORT_HASH - len(suffix)
    head = text[:keep].rstrip("-._")
    return f"{head}-{_digest(text)}{suffix}" if head else f"{_digest(text)}{suffix}"


def default_secret_name(name: str) -> str:
    """The connection Secret's name when the spec names none: `<name>-connection`; for a
    name over 242 characters (the result would pass 253), its first 233 characters (without
    a trailing '-' or '.'), '-', 8 hex digits of its SHA-256 and `-connection`."""
    if len(name) + len(SECRET_SUFFIX) <= MAX_NAME:
        return name + SECRET_SUFFIX
    return _shortened(name, MAX_NAME, SECRET_SUFFIX)


def label_value(text: str) -> str:
    """A name as a label value: itself when it fits (at most 63 characters); else its first
    54 characters (without a trailing '-', '.' or '_'), '-' and 8 hex digits of its
    SHA-256: at most 63 characters, beginning and ending with a letter or digit."""
    if len(text) <= MAX_LABEL_VALUE:
        return text
    return _shortened(text, MAX_LABEL_VALUE, "")


@dataclass(frozen=True)
class Dependency:
    """Another custom resource, in the same namespace, that must be Ready first.

    The reconciler resolves it to that resource's ARN and hands the ARN to the cloud
    client as `Resource.resolved[key]`.
    """

    key: str
    kind: str
    name: str
    role: str  # how messages name it: "dead-letter Queue"
    # Needed only to create the resource (a point-in-time restore's source): once it exists
    # (status.arn), the pass no longer waits for it.
    until_created: bool = False
    # The resource's connection Secret carries this one's password (a read replica's source).
    credentials: bool = False


@dataclass(frozen=True)
class Resource:
    """One custom resource as the reconciler and the cloud clients see it."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    region: str
    cluster_id: str
    spec: Any
    user_tags: dict[str, str] = field(default_factory=dict)
    deletion_policy: str = "Delete"
    secret_name: str = ""
    # spec.connectionSecret.keys: Secret key -> template ({{ .host }}); empty: the default keys.
    secret_keys: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    # The cloud name: explicit in the spec, or derived deterministically.
    external_name: str = ""
    # The cloud name was given in the spec (not derived), so adoption can apply.
    explicit_name: bool = False
    dependencies: tuple[Dependency, ...] = ()
    # ARNs of the dependencies, by Dependency.key, once the reconciler found them Ready.
    resolved: dict[str, str] = field(default_factory=dict)
    # spec.account and spec.region as written ("" when unset): where the user asked for it.
    spec_account: str = ""
    spec_region: str = ""
    # The CloudAccount it acts in, once placed (provisioner/placement/accounts.py); None: the
    # operator's own credentials.
    account: AccountRef | None = None
    # spec.access: (ServiceAccount name, level) in the order written.
    access: tuple[tuple[str, str], ...] = ()
    # When the operator deletes it (spec.ttl from metadata.creationTimestamp, or
    # spec.expiresAt; both API server times); None: never.
    expires_at: datetime | None = None
    created_at: datetime | None = None
    # The ResourceClass its spec is completed from (None: none), or why it may not use one.
    class_use: ClassUse | None = None
    class_refused: ClassRefused | None = None

    @classmethod
    def from_body(
        cls,
        body: Mapping[str, Any],
        descriptor: SpecParser,
        *,
        region: str,
        cluster_id: str,
    ) -> Resource:
        # One internal version (v1beta1) whatever version the body was written in.
        body = conversion.to_internal(body)
        meta = body["metadata"]
        raw_spec = body.get("spec") or {}
        spec = descriptor.parse_spec(raw_spec)
        ref = raw_spec.get("connectionSecret") or {}
        explicit = str(raw_spec.get(descriptor.name_field) or "")
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        created = parse_time(meta["creationTimestamp"]) if meta.get("creationTimestamp") else None
        return cls(
            kind=descriptor.kind,
            namespace=namespace,
            name=name,
            uid=uid,
            generation=int(meta.get("generation") or 1),
            region=raw_spec.get("region") or region,
            cluster_id=cluster_id,
            spec=spec,
            user_tags=dict(raw_spec.get("tags") or {}),
            deletion_policy=raw_spec.get("deletionPolicy") or descriptor.default_deletion_policy,
            secret_name=ref.get("name") or default_secret_name(name),
            secret_keys=dict(ref.get("keys") or {}),
            annotations=dict(meta.get("annotations") or {}),
            status=dict(body.get("status") or {}),
            external_name=explicit or descriptor.derive_name(namespace, name, uid, spec),
            explicit_name=bool(explicit),
            dependencies=tuple(descriptor.dependencies(spec)),
            spec_account=str(raw_spec.get("account") or ""),
            spec_region=str(raw_spec.get("region") or ""),
            expires_at=expiry(raw_spec, created),
            created_at=created,
            access=tuple(
                (str(g.get("serviceAccountName") or ""), str(g.get("level") or "read"))
                for g in raw_spec.get("access") or []
            ),
        )

    @property
    def ownership_tags(self) -> dict[str, str]:
        return {
            OWNER_UID_TAG: self.uid,
            NAMESPACE_TAG: self.namespace,
            NAME_TAG: self.name,
            CLUSTER_TAG: self.cluster_id,
        }

    @property
    def desired_tags(self) -> dict[str, str]:
        """User tags first, ownership tags last so that they always win."""
        tags = {k: v for k, v in self.user_tags.items() if k not in OWNERSHIP_TAG_KEYS}
        tags.update(self.ownership_tags)
        return tags

    def annotation(self, key: str) -> str:
        return self.annotations.get(key, "")

    @property
    def paused(self) -> bool:
        return annotation_keys.is_true(self.annotation(annotation_keys.PAUSED))

    @property
    def adopt(self) -> bool:
        return annotation_keys.is_true(self.annotation(annotation_keys.ADOPT))

    @property
    def drift_report_only(self) -> bool:
        return self.annotation(annotation_keys.DRIFT_POLICY).strip().lower() == "report"

    @property
    def reconcile_request_pending(self) -> bool:
        value = self.annotation(annotation_keys.RECONCILE_REQUESTED_AT)
        return bool(value) and value != self.status.get("lastReconcileRequest")

    @property
    def rotation_pending(self) -> bool:
        value = self.annotation(annotation_keys.ROTATE_PASSWORD_AT)
        return bool(value) and value != self.status.get("lastPasswordRotation")

    @property
    def plan_only(self) -> bool:
        return annotation_keys.is_true(self.annotation(annotation_keys.PLAN_ONLY))

    @property
    def requested_by(self) -> str:
        return self.annotation(annotation_keys.REQUESTED_BY)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


DURATION = re.compile(r"(\d+)([dhms])")
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> timedelta:
    """`72h`, `1h30m`, `7d`, `90s` (the CRD's pattern allows nothing else)."""
    parts = DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (e.g. 72h, 1h30m, 7d)")
    return timedelta(seconds=sum(int(n) * UNITS[u] for n, u in parts))


def parse_time(text: str) -> datetime:
    found = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def expiry(spec: Mapping[str, Any], created: datetime | None) -> datetime | None:
    """spec.expiresAt, or metadata.creationTimestamp + spec.ttl; None without either."""
    if spec.get("expiresAt"):
        return parse_time(str(spec["expiresAt"]))
    if spec.get("ttl") and created:
        return created + parse_duration(str(spec["ttl"]))
    return None
