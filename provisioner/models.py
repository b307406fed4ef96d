"""Typed views of the custom resources, parsed once at the edge.

The API server has already applied the CRD defaults and validation; these parsers
only turn the raw dicts into objects and fill the few defaults that depend on the
operator's configuration (region) or on the object itself (derived names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner import annotations, naming

OWNER_UID_TAG = "provisioner.dev/owner-uid"
NAMESPACE_TAG = "provisioner.dev/namespace"
NAME_TAG = "provisioner.dev/name"
CLUSTER_TAG = "provisioner.dev/cluster"
OWNERSHIP_TAG_KEYS = (OWNER_UID_TAG, NAMESPACE_TAG, NAME_TAG, CLUSTER_TAG)
# Resource.resolved key of a Queue's dead-letter target.
DEAD_LETTER_ARN = "deadLetterArn"


@dataclass(frozen=True)
class DatabaseSpec:
    engine: str
    instance_class: str
    allocated_storage_gib: int = 20
    engine_version: str | None = None
    master_username: str = "app"
    database_name: str | None = None
    port: int | None = None
    multi_az: bool = False
    publicly_accessible: bool = False
    backup_retention_days: int = 7
    instance_identifier: str | None = None

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> DatabaseSpec:
        return cls(
            instance_identifier=spec.get("instanceIdentifier") or None,
            engine=spec["engine"],
            instance_class=spec["instanceClass"],
            allocated_storage_gib=int(spec.get("allocatedStorageGiB", 20)),
            engine_version=spec.get("engineVersion") or None,
            master_username=spec.get("masterUsername", "app"),
            database_name=spec.get("databaseName") or None,
            port=int(spec["port"]) if spec.get("port") is not None else None,
            multi_az=bool(spec.get("multiAZ", False)),
            publicly_accessible=bool(spec.get("publiclyAccessible", False)),
            backup_retention_days=int(spec.get("backupRetentionDays", 7)),
        )


@dataclass(frozen=True)
class BucketSpec:
    bucket_name: str | None = None
    versioning: bool = False
    encryption: str = "AES256"
    block_public_access: bool = True
    expire_after_days: int | None = None
    force_destroy: bool = False

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> BucketSpec:
        lifecycle = spec.get("lifecycle") or {}
        expire = lifecycle.get("expireAfterDays")
        return cls(
            bucket_name=spec.get("bucketName") or None,
            versioning=bool(spec.get("versioning", False)),
            encryption=spec.get("encryption", "AES256"),
            block_public_access=bool(spec.get("blockPublicAccess", True)),
            expire_after_days=int(expire) if expire is not None else None,
            force_destroy=bool(spec.get("forceDestroy", False)),
        )


@dataclass(frozen=True)
class QueueSpec:
    queue_name: str | None = None
    fifo: bool = False
    visibility_timeout_seconds: int = 30
    message_retention_seconds: int = 345600
    delay_seconds: int = 0
    dead_letter_queue_ref: str | None = None
    max_receive_count: int = 5

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> QueueSpec:
        dead_letter = spec.get("deadLetter") or {}
        ref = (dead_letter.get("queueRef") or {}).get("name")
        return cls(
            queue_name=spec.get("queueName") or None,
            fifo=bool(spec.get("fifo", False)),
            visibility_timeout_seconds=int(spec.get("visibilityTimeoutSeconds", 30)),
            message_retention_seconds=int(spec.get("messageRetentionSeconds", 345600)),
            delay_seconds=int(spec.get("delaySeconds", 0)),
            dead_letter_queue_ref=ref or None,
            max_receive_count=int(dead_letter.get("maxReceiveCount", 5)),
        )


SPEC_PARSERS = {
    "DatabaseInstance": DatabaseSpec.parse,
    "S3Bucket": BucketSpec.parse,
    "Queue": QueueSpec.parse,
}

DEFAULT_DELETION_POLICY = {"DatabaseInstance": "Snapshot", "S3Bucket": "Delete", "Queue": "Delete"}


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
    annotations: dict[str, str] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    # ARNs of the dependencies, by Dependency.key, once the reconciler found them Ready.
    resolved: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, region: str, cluster_id: str) -> Resource:
        meta = body["metadata"]
        kind = body["kind"]
        raw_spec = body.get("spec") or {}
        ref = raw_spec.get("writeConnectionSecretToRef") or {}
        return cls(
            kind=kind,
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            generation=int(meta.get("generation") or 1),
            region=raw_spec.get("region") or region,
            cluster_id=cluster_id,
            spec=SPEC_PARSERS[kind](raw_spec),
            user_tags=dict(raw_spec.get("tags") or {}),
            deletion_policy=raw_spec.get("deletionPolicy") or DEFAULT_DELETION_POLICY[kind],
            secret_name=ref.get("name") or f"{meta['name']}-connection",
            annotations=dict(meta.get("annotations") or {}),
            status=dict(body.get("status") or {}),
        )

    @property
    def dependencies(self) -> list[Dependency]:
        ref = getattr(self.spec, "dead_letter_queue_ref", None)
        return [Dependency(DEAD_LETTER_ARN, "Queue", ref, "dead-letter Queue")] if ref else []

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

    @property
    def external_name(self) -> str:
        """The deterministic cloud identifier, so a retried create finds an earlier one."""
        if self.kind == "S3Bucket":
            return self.spec.bucket_name or naming.bucket_name(self.namespace, self.name, self.uid)
        if self.kind == "Queue":
            return self.spec.queue_name or naming.queue_name(
                self.namespace, self.name, self.uid, fifo=self.spec.fifo
            )
        return self.spec.instance_identifier or naming.db_instance_identifier(
            self.namespace, self.name, self.uid
        )

    @property
    def explicit_name(self) -> bool:
        """The cloud name was given in the spec (not derived), so adoption can apply."""
        spec = self.spec
        return bool(
            getattr(spec, "bucket_name", None)
            or getattr(spec, "queue_name", None)
            or getattr(spec, "instance_identifier", None)
        )

    def annotation(self, key: str) -> str:
        return self.annotations.get(key, "")

    @property
    def paused(self) -> bool:
        return annotations.is_true(self.annotation(annotations.PAUSED))

    @property
    def adopt(self) -> bool:
        return annotations.is_true(self.annotation(annotations.ADOPT))

    @property
    def drift_report_only(self) -> bool:
        return self.annotation(annotations.DRIFT_POLICY).strip().lower() == "report"

    @property
    def reconcile_request_pending(self) -> bool:
        value = self.annotation(annotations.RECONCILE_REQUESTED_AT)
        return bool(value) and value != self.status.get("lastReconcileRequest")

    @property
    def rotation_pending(self) -> bool:
        value = self.annotation(annotations.ROTATE_PASSWORD_AT)
        return bool(value) and value != self.status.get("lastPasswordRotation")

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"
