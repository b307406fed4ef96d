"""S3Bucket: one S3 bucket named `resource.external_name`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.codes import S3_SLOW_DOWN
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws
from provisioner.kinds import notifications, s3_settings, tagging
from provisioner.kinds.contract import (
    FieldDiff,
    KindDescriptor,
    Observation,
    OwnedResource,
    levels,
    owner_of,
)
from provisioner.kinds.tagging import ObservedTags
from provisioner.model import naming
from provisioner.model.account import AccountRef
from provisioner.model.resource import Resource


@dataclass(frozen=True)
class BucketSpec:
    bucket_name: str | None = None
    versioning: bool = False
    encryption: str = "AES256"
    block_public_access: bool = True
    expire_after_days: int | None = None
    force_destroy: bool = False
    # kmsKeyId, bucketKeyEnabled, cors, objectOwnership (provisioner/kinds/s3_settings.py)
    settings: s3_settings.Settings = s3_settings.NO_SETTINGS
    # spec.notifications (provisioner/kinds/notifications.py)
    notifications: tuple[notifications.Notification, ...] = ()

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
            settings=s3_settings.Settings.parse(spec),
            notifications=notifications.parse(spec),
        )


LIFECYCLE_RULE_ID = "provisioner-expire"
PUBLIC_ACCESS_KEYS = (
    "BlockPublicAcls IgnorePublicAcls BlockPublicPolicy RestrictPublicBuckets".split()
)
# ListObjectVersions page size, and the most keys one DeleteObjects takes.
PAGE_SIZE = 1000
# A setter turns a desired value into (S3 operation, its arguments besides Bucket).
Setter = Callable[[Any], tuple[str, dict[str, Any]]]


def _versioning(on: bool) -> tuple[str, dict[str, Any]]:
    status = "Enabled" if on else "Suspended"
    return "put_bucket_versioning", {"VersioningConfiguration": {"Status": status}}


def _public_access(block: bool) -> tuple[str, dict[str, Any]]:
    if not block:
        return "delete_public_access_block", {}
    config = dict.fromkeys(PUBLIC_ACCESS_KEYS, True)
    return "put_public_access_block", {"PublicAccessBlockConfiguration": config}


def _lifecycle(days: int | None) -> tuple[str, dict[str, Any]]:
    if days is None:
        return "delete_bucket_lifecycle", {}
    rule = {
        "ID": LIFECYCLE_RULE_ID,
        "Status": "Enabled",
        "Filter": {"Prefix": ""},
        "Expiration": {"Days": days},
    }
    return "put_bucket_lifecycle_configuration", {"LifecycleConfiguration": {"Rules": [rule]}}


# Mutable spec fields: contract field -> (spec attribute, setter). Encryption, CORS and
# object ownership: s3_settings.
FIELDS: dict[str, tuple[str, Setter]] = {
    "spec.versioning": ("versioning", _versioning),
    "spec.blockPublicAccess": ("block_public_access", _public_access),
    "spec.lifecycle.expireAfterDays": ("expire_after_days", _lifecycle),
}

# What a bucket has right after CreateBucket, for the fields where that is certain.
FRESH_BUCKET: dict[str, Any] = {"spec.versioning": False, "spec.lifecycle.expireAfterDays": None}


class S3Client(tagging.BatchTagLooks):
    tags_on_create = False  # CreateBucket takes none: tagged right after

    def __init__(self, aws: Aws) -> None:
        self.aws = aws

    def _s3(self, resource: Resource) -> Any:
        return self.aws.client("s3", resource.region, resource.account)

    def _get(self, fn: Any, bucket: str) -> dict[str, Any]:
        """A Get* sub-resource call; its not-found code means "unset" ({})."""
        try:
            return self.aws.call(fn, Bucket=bucket)
        except errors.NotFoundError:
            return {}

    def arns(self, region: str, names: Sequence[str], account: AccountRef | None) -> dict[str, str]:
        partition = self.aws.partition(region)
        return {f"arn:{partition}:s3:::{name}": name for name in names}

    def _observe(self, resource: Resource, batched: dict[str, str] | None) -> Observation:
        s3, name = self._s3(resource), resource.external_name
        notifications.wanted(resource)  # a FIFO target is refused before any call
        try:
            head = self.aws.call(s3.head_bucket, Bucket=name)
        except errors.NotFoundError:
            return Observation(exists=False)
        except errors.TerminalError as exc:
            if exc.code not in ("403", "AccessDenied"):
                raise
            # The name is taken by another account (or we may not even look at it).
            return Observation(exists=True, available=False, state="forbidden")
        tagged = tagging.observe_tags(resource, batched, lambda: self._tags(s3, name))
        config = self._config(s3, name)
        settings = resource.spec.settings
        config.update(s3_settings.read(lambda op: self._get(getattr(s3, op), name), settings))
        config.update(notifications.read(self.aws, s3, resource))
        return self._observation(resource, head.get("BucketRegion"), config, tagged)

    def _observation(
        self,
        resource: Resource,
        region: str | None,
        config: dict[str, Any],
        tagged: ObservedTags,
    ) -> Observation:
        name, region = resource.external_name, region or resource.region
        arn = f"arn:{self.aws.partition(region)}:s3:::{name}"
        endpoint = self.aws.settings.endpoint_url or f"https://s3.{region}.amazonaws.com"
        return Observation(
            exists=True,
            owner_uid=tagged.owner_uid,
            adoptable_by=tagged.adoptable_by,
            state="available",
            arn=arn,
            diffs=_diffs(resource, config)
            + _settings_diffs(resource, config)
            + tagged.diffs
            + notifications.diffs(resource, config),
            connection={
                **{"bucket": name, "region": region, "arn": arn, "endpoint": endpoint},
                **s3_settings.connection(resource.spec.encryption, resource.spec.settings),
            },
            status=notifications.status(resource, config),
            client_state={"config": config, "tags": tagged.tags},
        )

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation:
        s3, name, region = self._s3(resource), resource.external_name, resource.region
        where = {"LocationConstraint": region}
        spec = resource.spec
        args = s3_settings.create_args(spec.encryption, spec.settings, region)
        # us-east-1 takes no LocationConstraint, and answers 200 when the bucket is already
        # ours: there, as after "already owned by you", it may be another resource's bucket.
        maybe_existing = region == "us-east-1"
        try:
            if maybe_existing:
                self.aws.call(s3.create_bucket, Bucket=name, **args)
            else:
                self.aws.call(
                    s3.create_bucket, Bucket=name, CreateBucketConfiguration=where, **args
                )
        except errors.CloudError as exc:
            if exc.code != "BucketAlreadyOwnedByYou":
                raise
            maybe_existing = True
        if maybe_existing and (tags := self._tags(s3, name)) and owner_of(tags) != resource.uid:
            raise errors.ConflictError(
                f"bucket {name} already exists and is not owned by {resource.ref}",
                "BucketAlreadyExists",
            )
        # CreateBucket takes no tags: tag right away, then configure. A new bucket has
        # neither versioning nor lifecycle rules nor CORS rules, and the ownership CreateBucket
        # was given; encryption and the public access block are set whatever the spec says
        # (AWS and the emulators default them differently).
        # No read-back: the bucket is now exactly what was written.
        self._put_tags(s3, resource)
        config = {}
        for field, (attr, _) in FIELDS.items():
            config[field] = desired = getattr(resource.spec, attr)
            if field not in FRESH_BUCKET or FRESH_BUCKET[field] != desired:
                self._set(s3, resource, field, desired)
        calls, settings = s3_settings.created(spec.encryption, spec.settings, maybe_existing)
        for operation, kwargs in calls:
            self._write(s3, resource, operation, kwargs)
        config.update(settings)
        config.update(notifications.created(resource))
        tagged = ObservedTags.of(resource, dict(resource.desired_tags))
        return self._observation(resource, region, config, tagged)

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        s3, spec = self._s3(resource), resource.spec
        for diff in diffs:
            if diff.field not in s3_settings.FIELDS and diff.field != notifications.FIELD:
                self._apply(s3, resource, diff)
        config = observation.client_state.get("config") or {}
        settings = s3_settings.writes(
            spec.encryption, spec.settings, resource.region, config, diffs
        )
        for operation, kwargs in settings:
            self._write(s3, resource, operation, kwargs)
        if any(d.field == notifications.FIELD for d in diffs):
            notifications.apply(self.aws, s3, resource, config[notifications.FIELD])

    def delete(self, resource: Resource, observation: Observation) -> None:
        s3, name = self._s3(resource), resource.external_name
        seen = observation.client_state if observation is not None else {}
        looked = (seen.get("config") or {}).get(notifications.FIELD)
        notifications.remove_all(self.aws, s3, resource, looked)
        try:
            if resource.spec.force_destroy:
                self._empty(s3, name)
            elif self._versions(s3, name, 1):
                raise errors.DeletionBlocked(
                    f"bucket {name} still holds objects; set spec.forceDestroy: true to empty it "
                    "on deletion, or empty it yourself",
                    "BucketNotEmpty",
                )
            self.aws.call(s3.delete_bucket, Bucket=name)
        except errors.NotFoundError:
            return
        except errors.DeletionBlocked:
            raise
        except errors.CloudError as exc:
            if exc.code != "BucketNotEmpty":
                raise
            raise errors.RetryableError(
                f"bucket {name} got new objects; will retry", exc.code
            ) from None

    def _tags(self, s3: Any, name: str) -> dict[str, str]:
        tag_set = self._get(s3.get_bucket_tagging, name).get("TagSet") or []
        return {tag["Key"]: tag["Value"] for tag in tag_set}

    def _put_tags(self, s3: Any, resource: Resource) -> None:
        tag_set = [{"Key": k, "Value": v} for k, v in resource.desired_tags.items()]
        self.aws.call(
            s3.put_bucket_tagging, Bucket=resource.external_name, Tagging={"TagSet": tag_set}
        )

    def _config(self, s3: Any, name: str) -> dict[str, Any]:
        """The bucket's configuration keyed by contract field."""
        versioning = self._get(s3.get_bucket_versioning, name)
        block = (
            self._get(s3.get_public_access_block, name).get("PublicAccessBlockConfiguration") or {}
        )
        lifecycle = self._get(s3.get_bucket_lifecycle_configuration, name).get("Rules") or []
        return {
            "spec.versioning": versioning.get("Status") == "Enabled",
            "spec.blockPublicAccess": bool(block) and all(block.get(k) for k in PUBLIC_ACCESS_KEYS),
            "spec.lifecycle.expireAfterDays": _expire_days(lifecycle),
        }

    def _apply(self, s3: Any, resource: Resource, diff: FieldDiff) -> None:
        if diff.field == "tags":
            self._put_tags(s3, resource)
        else:
            self._set(s3, resource, diff.field, diff.desired)

    def _set(self, s3: Any, resource: Resource, field: str, desired: Any) -> None:
        self._write(s3, resource, *FIELDS[field][1](desired))

    def _write(self, s3: Any, resource: Resource, operation: str, kwargs: dict[str, Any]) -> None:
        try:
            self.aws.call(getattr(s3, operation), Bucket=resource.external_name, **kwargs)
        except errors.NotFoundError:
            if not operation.startswith("delete_"):
                raise  # deleting what is not there is done

    def _versions(self, s3: Any, name: str, limit: int) -> list[dict[str, str]]:
        """Up to `limit` object versions and delete markers (the first page, no markers)."""
        answer = self.aws.call(s3.list_object_versions, Bucket=name, MaxKeys=limit)
        return [
            {"Key": item["Key"], "VersionId": item["VersionId"]}
            for item in answer.get("Versions", []) + answer.get("DeleteMarkers", [])
        ]

    def _empty(self, s3: Any, name: str) -> None:
        # Delete the first page until there is none: the version-id marker of a version just
        # deleted is no reliable place to resume listing from (moto restarts or skips).
        while keys := self._versions(s3, name, PAGE_SIZE):
            answer = self.aws.call(
                s3.delete_objects, Bucket=name, Delete={"Objects": keys, "Quiet": True}
            )
            if answer.get("Errors"):
                error = answer["Errors"][0]
                raise errors.DeletionBlocked(
                    f"cannot empty bucket {name}: {error.get('Key')}: {error.get('Message')}",
                    error.get("Code", ""),
                )


def _expire_days(rules: list[dict[str, Any]]) -> int | str | None:
    """Our single expiry rule's days; None when there are no rules; a note for anything else."""
    if not rules:
        return None
    rule = rules[0]
    if len(rules) == 1 and rule.get("ID") == LIFECYCLE_RULE_ID and rule.get("Status") == "Enabled":
        days: int | None = rule.get("Expiration", {}).get("Days")
        return days
    return f"{len(rules)} other lifecycle rule(s)"


def _diffs(resource: Resource, config: dict[str, Any]) -> list[FieldDiff]:
    """The bucket's configuration that differs from the spec."""
    diffs = []
    for field, (attr, _) in FIELDS.items():
        desired = getattr(resource.spec, attr)
        if config[field] != desired:
            diffs.append(FieldDiff(field, config[field], desired))
    return diffs


def _settings_diffs(resource: Resource, config: dict[str, Any]) -> list[FieldDiff]:
    return s3_settings.diffs(resource.spec.encryption, resource.spec.settings, config)


def list_buckets(aws: Aws, region: str) -> Iterator[OwnedResource]:
    s3 = aws.client("s3", region)
    for bucket in aws.call(s3.list_buckets).get("Buckets", []):
        try:
            tag_set = aws.call(s3.get_bucket_tagging, Bucket=bucket["Name"])["TagSet"]
        except errors.NotFoundError as exc:
            if exc.code != "NoSuchTagSet":
                continue  # deleted since it was listed
            tag_set = []  # untagged: listed, with no owner
        yield OwnedResource(KIND.kind, bucket["Name"], {t["Key"]: t["Value"] for t in tag_set})


# spec.access: AWS's access levels (Service Authorization Reference, "Actions defined by
# Amazon S3"): `read` holds only Read and List actions; no level deletes the bucket or changes
# what the spec owns (policy, tags, versioning, lifecycle, encryption, public access).
ACCESS = levels(
    read=(
        "s3:GetObject",
        "s3:GetObjectVersion",
        "s3:ListBucket",
        "s3:ListBucketVersions",
        "s3:GetBucketLocation",
    ),
    write=(
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:DeleteObjectVersion",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
        "s3:ListBucketMultipartUploads",
    ),
    admin=(
        "s3:GetObjectAcl",
        "s3:PutObjectAcl",
        "s3:GetObjectTagging",
        "s3:PutObjectTagging",
        "s3:DeleteObjectTagging",
        "s3:RestoreObject",
        "s3:GetBucketCORS",
        "s3:PutBucketCORS",
        "s3:GetBucketNotification",
        "s3:PutBucketNotification",
    ),
)


KIND = KindDescriptor(
    kind="S3Bucket",
    plural="s3buckets",
    short_names=("s3b",),
    service="s3",
    parse_spec=BucketSpec.parse,
    default_deletion_policy="Delete",
    name_field="bucketName",
    derive_name=lambda namespace, name, uid, spec: naming.bucket_name(namespace, name, uid),
    client=S3Client,
    list_resources=list_buckets,
    access_actions=ACCESS,
    # The bucket (ListBucket, GetBucketLocation, ...) and every object in it.
    access_resources=lambda arn: [arn, f"{arn}/*"],
    dependencies=lambda spec: notifications.dependencies(spec.notifications),
    recorded_status=(notifications.STATUS,),
    error_codes=ErrorCodes(
        not_found=frozenset(
            {
                "NoSuchBucket",
                "NoSuchTagSet",
                "NoSuchLifecycleConfiguration",
                "ServerSideEncryptionConfigurationNotFoundError",
                "NoSuchPublicAccessBlockConfiguration",
                "NoSuchCORSConfiguration",
                "OwnershipControlsNotFoundError",
            }
        ),
        conflict=frozenset({"BucketAlreadyExists"}),
        retryable=frozenset({S3_SLOW_DOWN}),
        # "A conflicting conditional operation is currently in progress against this
        # resource": what CreateBucket answers while a just-deleted bucket's name is held.
        name_held=frozenset({"OperationAborted"}),
    ),
)
