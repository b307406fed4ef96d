"""DatabaseInstance's encryption, deletion protection, windows and engine versions.

- Encryption (`spec.encryption`) is set at create only: RDS cannot encrypt or decrypt an
  existing instance in place, so an instance that differs (adopted, or made before the field
  existed) keeps running as it is, and its status says so (`status.storageEncrypted`).
- Deletion protection, the maintenance and backup windows and automatic minor upgrades are
  mutable fields of ModifyDBInstance, compared on every look like the others.
- An engine version change is a minor upgrade in place; a major upgrade only with
  `spec.allowMajorVersionUpgrade`; a downgrade never (RDS has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.kinds.contract import FieldDiff

# Compared without regard to case: RDS answers the windows in lower case ("mon:03:00-...").
WINDOW_FIELDS = frozenset({"spec.maintenanceWindow", "spec.backupWindow"})


@dataclass(frozen=True)
class EncryptionSpec:
    enabled: bool = True
    kms_key_id: str | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> EncryptionSpec:
        raw = raw or {}
        return cls(enabled=bool(raw.get("enabled", True)), kms_key_id=raw.get("kmsKeyId") or None)

    def create_params(self) -> dict[str, Any]:
        """CreateDBInstance's encryption parameters."""
        if not self.enabled:
            return {"StorageEncrypted": False}
        key = {"KmsKeyId": self.kms_key_id} if self.kms_key_id else {}
        return {"StorageEncrypted": True, **key}


def encryption_status(instance: Mapping[str, Any]) -> dict[str, Any]:
    """What the instance is, whatever the spec says (encryption is never changed in place)."""
    encrypted = bool(instance.get("StorageEncrypted", False))
    return {
        "storageEncrypted": encrypted,
        "kmsKeyId": (instance.get("KmsKeyId") or None) if encrypted else None,
    }


def same(field: str, observed: object, desired: object) -> bool | None:
    """The comparison of the fields of this module (None: not one of them)."""
    if field in WINDOW_FIELDS:
        return str(observed).lower() == str(desired).lower()
    return None


def version_params(engine: str, allow_major: bool, version: FieldDiff | None) -> dict[str, Any]:
    """ModifyDBInstance's parameters for an engine version change (none without one), or the
    refusal of a downgrade and of a major upgrade the spec does not allow."""
    if version is None:
        return {}
    observed, desired = str(version.observed), str(version.desired)
    if _older(desired, observed):
        raise errors.TerminalError(
            f"spec.engineVersion {desired} is older than the instance's {observed}: RDS cannot "
            f"downgrade an instance; set spec.engineVersion to {observed} or later (restore a "
            "snapshot into a new instance to go back)",
            "InvalidSpec",
        )
    if major(engine, observed) == major(engine, desired):
        return {}
    if not allow_major:
        raise errors.TerminalError(
            f"spec.engineVersion {desired} is a major version upgrade from {observed}: set "
            "spec.allowMajorVersionUpgrade: true to allow it (test it on a copy first: it "
            "cannot be undone)",
            "InvalidSpec",
        )
    return {"AllowMajorVersionUpgrade": True}


def _older(desired: str, observed: str) -> bool:
    """Whether `desired` is a lower version than `observed`; a prefix ("16" of "16.4") is
    not lower."""
    want, have = _numbers(desired), _numbers(observed)
    return want < have[: len(want)]


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def major(engine: str, version: str) -> str:
    """RDS major version: "16" for postgres >= 10, else two parts ("9.6", "8.0", "10.11")."""
    parts = str(version).split(".")
    if engine == "postgres" and parts[0].isdigit() and int(parts[0]) >= 10:
        return parts[0]
    return ".".join(parts[:2])
