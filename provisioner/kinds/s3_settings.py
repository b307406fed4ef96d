"""S3Bucket's default encryption (with its KMS key and S3 Bucket Key), CORS rules and object
ownership, as contract fields: read, compared with the spec (FieldDiffs) and written.

- `spec.encryption`, `spec.kmsKeyId` and `spec.bucketKeyEnabled` are one rule of
  PutBucketEncryption, read on every look (GetBucketEncryption, as before). The key and the
  bucket key are compared only where they apply: the key always (a key left in the cloud
  under AES256 differs from none), the bucket key when the spec and the cloud both say
  `aws:kms`.
- `spec.cors` is managed only when the spec sets it: absent, it is neither read nor written
  (no call); an empty list means "no rules" (DeleteBucketCors).
- `spec.objectOwnership` is managed only when set; a new bucket is created with it, or with
  BucketOwnerEnforced when unset, in CreateBucket itself (no call of its own).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.kinds.contract import FieldDiff

KMS = "aws:kms"
ENCRYPTION = "spec.encryption"
KEY = "spec.kmsKeyId"
BUCKET_KEY = "spec.bucketKeyEnabled"
CORS = "spec.cors"
OWNERSHIP = "spec.objectOwnership"
ENCRYPTION_FIELDS = (ENCRYPTION, KEY, BUCKET_KEY)
FIELDS = frozenset({*ENCRYPTION_FIELDS, CORS, OWNERSHIP})
DEFAULT_OWNERSHIP = "BucketOwnerEnforced"
# The AWS managed key S3 uses under aws:kms when no key is named.
MANAGED_KEY = "alias/aws/s3"
# A KMS key or alias ARN: arn:<partition>:kms:<region>:<account>:key/<id> or alias/<name>.
KEY_ARN = re.compile(r"arn:[^:]+:kms:([^:]*):[^:]*:((?:key|alias)/.+)")

# An S3 operation and its arguments besides Bucket.
Call = tuple[str, dict[str, Any]]
# A Get* operation's name -> its answer ({} when the setting is unset).
Getter = Callable[[str], dict[str, Any]]


def _strings(raw: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in raw or ())


@dataclass(frozen=True)
class CorsRule:
    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    allowed_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age_seconds: int | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CorsRule:
        age = raw.get("maxAgeSeconds")
        return cls(
            allowed_origins=_strings(raw.get("allowedOrigins")),
            allowed_methods=_strings(raw.get("allowedMethods")),
            allowed_headers=_strings(raw.get("allowedHeaders")),
            expose_headers=_strings(raw.get("exposeHeaders")),
            max_age_seconds=int(age) if age is not None else None,
        )

    @classmethod
    def from_cloud(cls, raw: Mapping[str, Any]) -> CorsRule:
        """A rule of GetBucketCors (its ID, which the spec has no field for, left out)."""
        age = raw.get("MaxAgeSeconds")
        return cls(
            allowed_origins=_strings(raw.get("AllowedOrigins")),
            allowed_methods=_strings(raw.get("AllowedMethods")),
            allowed_headers=_strings(raw.get("AllowedHeaders")),
            expose_headers=_strings(raw.get("ExposeHeaders")),
            max_age_seconds=int(age) if age is not None else None,
        )

    def shown(self) -> dict[str, Any]:
        """As the spec writes it: what a diff, a plan and an Event show."""
        shown: dict[str, Any] = {
            "allowedOrigins": list(self.allowed_origins),
            "allowedMethods": list(self.allowed_methods),
        }
        if self.allowed_headers:
            shown["allowedHeaders"] = list(self.allowed_headers)
        if self.expose_headers:
            shown["exposeHeaders"] = list(self.expose_headers)
        if self.max_age_seconds is not None:
            shown["maxAgeSeconds"] = self.max_age_seconds
        return shown

    def to_cloud(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "AllowedOrigins": list(self.allowed_origins),
            "AllowedMethods": list(self.allowed_methods),
        }
        if self.allowed_headers:
            rule["AllowedHeaders"] = list(self.allowed_headers)
        if self.expose_headers:
            rule["ExposeHeaders"] = list(self.expose_headers)
        if self.max_age_seconds is not None:
            rule["MaxAgeSeconds"] = self.max_age_seconds
        return rule


@dataclass(frozen=True)
class Settings:
    """The spec's fields of this module besides `encryption` (which BucketSpec holds)."""

    kms_key_id: str | None = None
    bucket_key_enabled: bool = True
    # None: CORS is not managed; (): managed, no rules.
    cors: tuple[CorsRule, ...] | None = None
    # None: not managed (a new bucket gets DEFAULT_OWNERSHIP).
    object_ownership: str | None = None

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> Settings:
        cors = spec.get("cors")
        return cls(
            kms_key_id=spec.get("kmsKeyId") or None,
            bucket_key_enabled=bool(spec.get("bucketKeyEnabled", True)),
            cors=None if cors is None else tuple(CorsRule.parse(rule) for rule in cors),
            object_ownership=spec.get("objectOwnership") or None,
        )


# What a spec without these fields means (frozen: one instance serves every spec).
NO_SETTINGS = Settings()


def desired(encryption: str, settings: Settings) -> dict[str, Any]:
    """The spec's values of the fields it manages, keyed by contract field."""
    kms = encryption == KMS
    wanted: dict[str, Any] = {
        ENCRYPTION: encryption,
        KEY: settings.kms_key_id if kms else None,
        BUCKET_KEY: settings.bucket_key_enabled if kms else None,
    }
    if settings.cors is not None:
        wanted[CORS] = [rule.shown() for rule in settings.cors]
    if settings.object_ownership:
        wanted[OWNERSHIP] = settings.object_ownership
    return wanted


def read(get: Getter, settings: Settings) -> dict[str, Any]:
    """The bucket's settings keyed by contract field: encryption always; CORS and ownership
    only when the spec manages them."""
    answer = get("get_bucket_encryption")
    rules = answer.get("ServerSideEncryptionConfiguration", {}).get("Rules") or [{}]
    default = rules[0].get("ApplyServerSideEncryptionByDefault") or {}
    algorithm = default.get("SSEAlgorithm")
    config: dict[str, Any] = {
        ENCRYPTION: algorithm,
        KEY: _observed_key(default.get("KMSMasterKeyID"), settings.kms_key_id),
        BUCKET_KEY: bool(rules[0].get("BucketKeyEnabled")) if algorithm == KMS else None,
    }
    if settings.cors is not None:
        cloud = get("get_bucket_cors").get("CORSRules") or []
        config[CORS] = [CorsRule.from_cloud(rule).shown() for rule in cloud]
    if settings.object_ownership:
        controls = get("get_bucket_ownership_controls").get("OwnershipControls") or {}
        found = controls.get("Rules") or [{}]
        config[OWNERSHIP] = found[0].get("ObjectOwnership")
    return config


def diffs(encryption: str, settings: Settings, config: Mapping[str, Any]) -> list[FieldDiff]:
    """The settings that differ from the spec."""
    found = []
    for field, want in desired(encryption, settings).items():
        if field == BUCKET_KEY and (encryption != KMS or config.get(ENCRYPTION) != KMS):
            continue  # no bucket key outside aws:kms: the algorithm's diff says it all
        if config.get(field) != want:
            found.append(FieldDiff(field, config.get(field), want))
    return found


def create_args(encryption: str, settings: Settings, region: str) -> dict[str, Any]:
    """CreateBucket's arguments for these settings; refuses a key of another region first."""
    if encryption == KMS:
        _check_region(settings.kms_key_id, region)
    return {"ObjectOwnership": settings.object_ownership or DEFAULT_OWNERSHIP}


def created(
    encryption: str, settings: Settings, existing: bool
) -> tuple[list[Call], dict[str, Any]]:
    """The calls that configure a bucket just created (`existing`: it may be older), and its
    settings once they are made. Its ownership came with CreateBucket; a new bucket has no
    CORS rules."""
    wanted = desired(encryption, settings)
    calls = [_encryption_call(wanted)]
    if settings.cors or (existing and settings.cors is not None):
        calls.append(_cors_call(settings.cors or ()))
    if existing and settings.object_ownership:
        calls.append(_ownership_call(settings.object_ownership))
    return calls, wanted


def writes(
    encryption: str,
    settings: Settings,
    region: str,
    config: Mapping[str, Any],
    to_write: Sequence[FieldDiff],
) -> list[Call]:
    """The calls that set exactly the fields of `to_write` that are this module's.

    The encryption fields are one rule: a new algorithm, or a cloud whose algorithm is not
    the spec's, takes the spec's whole rule (the key and bucket key belong to it); otherwise
    the fields written replace theirs in the cloud's rule, and the others stay as they are.
    """
    fields = {diff.field: diff.desired for diff in to_write if diff.field in FIELDS}
    calls = []
    encryption_written = {f: v for f, v in fields.items() if f in ENCRYPTION_FIELDS}
    if encryption_written:
        rule = desired(encryption, settings)
        if ENCRYPTION not in encryption_written and config.get(ENCRYPTION) == encryption:
            rule = {**{f: config.get(f) for f in ENCRYPTION_FIELDS}, **encryption_written}
        if rule[ENCRYPTION] == KMS:
            _check_region(rule[KEY], region)
        calls.append(_encryption_call(rule))
    if CORS in fields:
        calls.append(_cors_call(settings.cors or ()))
    if OWNERSHIP in fields and settings.object_ownership:
        calls.append(_ownership_call(settings.object_ownership))
    return calls


def connection(encryption: str, settings: Settings) -> dict[str, str]:
    """The connection Secret's values of these settings: the KMS key, when the spec names one."""
    if encryption == KMS and settings.kms_key_id:
        return {"kmsKeyId": settings.kms_key_id}
    return {}


def _encryption_call(rule: Mapping[str, Any]) -> Call:
    algorithm = rule[ENCRYPTION]
    default: dict[str, Any] = {"SSEAlgorithm": algorithm}
    entry: dict[str, Any] = {"ApplyServerSideEncryptionByDefault": default}
    if algorithm == KMS:
        if rule.get(KEY):
            default["KMSMasterKeyID"] = rule[KEY]
        entry["BucketKeyEnabled"] = bool(rule.get(BUCKET_KEY))
    return "put_bucket_encryption", {"ServerSideEncryptionConfiguration": {"Rules": [entry]}}


def _cors_call(rules: Sequence[CorsRule]) -> Call:
    if not rules:
        return "delete_bucket_cors", {}
    config = {"CORSRules": [rule.to_cloud() for rule in rules]}
    return "put_bucket_cors", {"CORSConfiguration": config}


def _ownership_call(ownership: str) -> Call:
    controls = {"Rules": [{"ObjectOwnership": ownership}]}
    return "put_bucket_ownership_controls", {"OwnershipControls": controls}


def _check_region(key: str | None, region: str) -> None:
    """S3 encrypts with KMS keys of the bucket's own region only."""
    match = KEY_ARN.fullmatch(key or "")
    if match and match.group(1) != region:
        raise errors.TerminalError(
            f"spec.kmsKeyId {key} is a key in {match.group(1) or 'no region'}; the bucket is "
            f"in {region}, and S3 uses KMS keys of the bucket's region only",
            "KMSKeyRegionMismatch",
        )


def _short(key: str) -> str:
    """A key ARN's key id or alias (`alias/<name>`); anything else as it is."""
    match = KEY_ARN.fullmatch(key)
    if not match:
        return key
    resource = match.group(2)
    return resource.removeprefix("key/")


def _observed_key(cloud: str | None, spec: str | None) -> str | None:
    """The cloud's key as the spec would write it when both name the same key: the cloud may
    answer with an ARN where the spec has the key id or alias (ARNs are compared whole: a
    multi-Region key has the same id in every region). S3's managed key counts as none."""
    if not cloud:
        return None
    if spec is None:
        return None if _short(cloud) == MANAGED_KEY else cloud
    if cloud == spec:
        return spec
    both_arns = KEY_ARN.fullmatch(cloud) and KEY_ARN.fullmatch(spec)
    return spec if not both_arns and _short(cloud) == _short(spec) else cloud
