"""A Queue's encryption and FIFO options: parsed from the spec, read from the one
GetQueueAttributes a look already makes, compared with the spec and written as queue
attributes (CreateQueue, SetQueueAttributes).

- `spec.encryption`: `SQS` is SSE-SQS (`SqsManagedSseEnabled=true`, as AWS makes new queues);
  `KMS` is SSE-KMS with `KmsMasterKeyId` and `KmsDataKeyReusePeriodSeconds` (default 300).
  One diff for the whole of it, written in one SetQueueAttributes. A queue with neither
  (SSE turned off behind the operator's back) shows as `None`.
- FIFO queues only: `ContentBasedDeduplication`, `DeduplicationScope`, `FifoThroughputLimit`;
  unset in the spec means AWS's default (false, `queue`, `perQueue`), kept like any other
  value. A standard queue has none of them (the CRD refuses them there, and SQS refuses
  them on a standard queue).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.aws import errors
from provisioner.kinds.contract import FieldDiff

SQS, KMS = "SQS", "KMS"
# KmsDataKeyReusePeriodSeconds: AWS's default, 5 minutes.
DEFAULT_DATA_KEY_REUSE = 300
ENCRYPTION_FIELD = "spec.encryption"
# (contract field, spec key, queue attribute, AWS's default)
FIFO_OPTIONS: tuple[tuple[str, str, str, Any], ...] = (
    (
        "spec.contentBasedDeduplication",
        "contentBasedDeduplication",
        "ContentBasedDeduplication",
        False,
    ),
    ("spec.deduplicationScope", "deduplicationScope", "DeduplicationScope", "queue"),
    ("spec.fifoThroughputLimit", "fifoThroughputLimit", "FifoThroughputLimit", "perQueue"),
)
FIFO_FIELDS = frozenset(f for f, _, _, _ in FIFO_OPTIONS)


@dataclass(frozen=True)
class Encryption:
    type: str = SQS
    kms_key_id: str = ""
    data_key_reuse_seconds: int = DEFAULT_DATA_KEY_REUSE

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Encryption:
        raw = raw or {}
        if str(raw.get("type") or SQS) != KMS:
            return cls()
        reuse = raw.get("dataKeyReuseSeconds")
        return cls(
            type=KMS,
            kms_key_id=str(raw.get("kmsKeyId") or ""),
            data_key_reuse_seconds=int(reuse) if reuse is not None else DEFAULT_DATA_KEY_REUSE,
        )

    def shown(self) -> dict[str, Any]:
        """As the spec spells it (a diff's value, a plan's column)."""
        if self.type != KMS:
            return {"type": SQS}
        return {
            "type": KMS,
            "kmsKeyId": self.kms_key_id,
            "dataKeyReuseSeconds": self.data_key_reuse_seconds,
        }

    def attributes(self, had_key: bool = False) -> dict[str, str]:
        """The queue attributes that make it so (`had_key`: a KMS key to take off)."""
        if self.type == KMS:
            if not self.kms_key_id:  # the CRD refuses it; a CRD without the rule may not
                raise errors.TerminalError(
                    "spec.encryption.kmsKeyId is required with spec.encryption.type KMS"
                )
            return {
                "KmsMasterKeyId": self.kms_key_id,
                "KmsDataKeyReusePeriodSeconds": str(self.data_key_reuse_seconds),
                "SqsManagedSseEnabled": "false",
            }
        return {"SqsManagedSseEnabled": "true", **({"KmsMasterKeyId": ""} if had_key else {})}


@dataclass(frozen=True)
class QueueSettings:
    encryption: Encryption = field(default_factory=Encryption)
    # FIFO options by spec key (contentBasedDeduplication, ...); AWS's default when unset.
    fifo_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> QueueSettings:
        options = {key: spec.get(key, default) for _, key, _, default in FIFO_OPTIONS}
        return cls(encryption=Encryption.parse(spec.get("encryption")), fifo_options=options)

    def option(self, key: str) -> Any:
        return self.fifo_options.get(key, next(d for _, k, _, d in FIFO_OPTIONS if k == key))


# A queue whose spec names none of them: SSE-SQS, and AWS's FIFO defaults.
NO_SETTINGS = QueueSettings()


def observed_encryption(attributes: Mapping[str, str]) -> Encryption | None:
    """The queue's server-side encryption; None when it has none."""
    key = attributes.get("KmsMasterKeyId") or ""
    if key:
        reuse = attributes.get("KmsDataKeyReusePeriodSeconds")
        return Encryption(KMS, key, int(reuse) if reuse else DEFAULT_DATA_KEY_REUSE)
    if str(attributes.get("SqsManagedSseEnabled", "")).lower() == "true":
        return Encryption()
    return None


def _option(attributes: Mapping[str, str], attribute: str, default: Any) -> Any:
    text = attributes.get(attribute)
    if text is None:
        return default
    return str(text).lower() == "true" if isinstance(default, bool) else str(text)


def diffs(settings: QueueSettings, fifo: bool, attributes: Mapping[str, str]) -> list[FieldDiff]:
    """The encryption and, for a FIFO queue, the FIFO options that differ from the spec."""
    found = []
    observed = observed_encryption(attributes)
    if observed != settings.encryption:
        shown = observed.shown() if observed is not None else None
        found.append(FieldDiff(ENCRYPTION_FIELD, shown, settings.encryption.shown()))
    if fifo:
        for contract_field, key, attribute, default in FIFO_OPTIONS:
            current, desired = _option(attributes, attribute, default), settings.option(key)
            if current != desired:
                found.append(FieldDiff(contract_field, current, desired))
    return found


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def create_attributes(settings: QueueSettings, fifo: bool) -> dict[str, str]:
    """CreateQueue's attributes for the encryption and the FIFO options."""
    attributes = settings.encryption.attributes()
    if fifo:
        for _, key, attribute, _ in FIFO_OPTIONS:
            attributes[attribute] = _text(settings.option(key))
    return attributes


def update_attributes(
    settings: QueueSettings, fields: set[str], current: Mapping[str, str]
) -> dict[str, str]:
    """SetQueueAttributes' attributes for the diffs of these contract `fields`."""
    attributes: dict[str, str] = {}
    if ENCRYPTION_FIELD in fields:
        attributes.update(settings.encryption.attributes(bool(current.get("KmsMasterKeyId"))))
    for contract_field, key, attribute, _ in FIFO_OPTIONS:
        if contract_field in fields:
            attributes[attribute] = _text(settings.option(key))
    return attributes


def connection(attributes: Mapping[str, str]) -> dict[str, str]:
    """The connection Secret's values of the encryption: the KMS key, when one is in use."""
    observed = observed_encryption(attributes)
    if observed is not None and observed.type == KMS:
        return {"kmsKeyId": observed.kms_key_id}
    return {}
