"""ResourceClasses as the reconciler reads them: a class, the effective spec a resource
gets from it, and the enforced fields it sets otherwise (provisioner/placement/classes.py
finds which class a resource uses).

The effective spec is the resource's own, with each top-level field it leaves unset taken
from the class. A field the API server fills with a schema default counts as unset while
it holds that default (defaulting leaves no trace of whether a user wrote it): a resource
cannot ask for the schema default against its class. Tags: the class's under the
resource's own (the CloudAccount's go under both, at placement).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.model import schema_defaults

# Fields a class never fills: which class, the resource's own tags (the class has its own
# `tags`), and what names one cloud resource to start from (a snapshot, a source).
NEVER_FROM_CLASS = frozenset({"className", "tags", "restoreFrom", "replicaOf"})


@dataclass(frozen=True)
class ResourceClass:
    name: str
    kind: str
    default: bool = False
    selector: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    enforced: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0
    deleting: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ResourceClass:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        return cls(
            name=str(meta.get("name", "")),
            kind=str(spec.get("kind", "")),
            default=bool(spec.get("default")),
            selector=dict(spec.get("namespaceSelector") or {}),
            defaults=dict(spec.get("defaults") or {}),
            enforced=tuple(str(f) for f in spec.get("enforced") or ()),
            tags={str(k): str(v) for k, v in (spec.get("tags") or {}).items()},
            generation=int(meta.get("generation") or 0),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True)
class ClassUse:
    """The class a resource's pass used, and what came from it."""

    name: str
    generation: int
    # Top-level spec fields whose value is the class's.
    fields: tuple[str, ...] = ()
    # Tag keys whose value is the class's.
    tag_keys: tuple[str, ...] = ()
    # Field -> digest of the class's value, for each field it sets ("tags": its tags).
    digests: Mapping[str, str] = field(default_factory=dict)

    @property
    def status(self) -> dict[str, Any]:
        """status.class: which class, at which generation, and a digest of each of its
        values (a later pass tells from them which ones the class changed)."""
        return {"name": self.name, "generation": self.generation, "fields": dict(self.digests)}

    def names(self, field_path: str) -> bool:
        """Whether a diff's field ("spec.network.securityGroupIds", "tags") came from it."""
        if field_path == "tags":
            return bool(self.tag_keys)
        parts = field_path.split(".")
        return len(parts) > 1 and parts[0] == "spec" and parts[1] in self.fields


def unset(kind: str, name: str, spec: Mapping[str, Any]) -> bool:
    """Whether spec.<name> is left to the class: absent, or at its schema default."""
    if name not in spec or spec[name] is None:
        return True
    has_default, default = schema_defaults.field_default(kind, name)
    return has_default and spec[name] == default


def violations(kind: str, spec: Mapping[str, Any], cls: ResourceClass) -> list[str]:
    """The enforced fields `spec` sets otherwise than the class, in the class's order."""
    return [
        name
        for name in cls.enforced
        if not unset(kind, name, spec) and spec[name] != cls.defaults.get(name)
    ]


def effective_spec(
    kind: str, spec: Mapping[str, Any], cls: ResourceClass
) -> tuple[dict[str, Any], ClassUse]:
    """The spec with what it leaves unset taken from the class, schema defaults filled in;
    and what came from the class."""
    out = dict(spec)
    taken = []
    for name, value in cls.defaults.items():
        if name not in NEVER_FROM_CLASS and unset(kind, name, spec):
            out[name] = value
            taken.append(name)
    own_tags = dict(spec.get("tags") or {})
    tag_keys = tuple(k for k in cls.tags if k not in own_tags)
    if cls.tags:
        out["tags"] = {**cls.tags, **own_tags}
    digests = {name: digest(cls.defaults[name]) for name in taken}
    if tag_keys:
        digests["tags"] = digest({k: cls.tags[k] for k in tag_keys})
    use = ClassUse(cls.name, cls.generation, tuple(taken), tag_keys, digests)
    return schema_defaults.spec_with_defaults(kind, out), use


class ClassRefused(Exception):
    """The resource may not use the class it names or would get, or sets an enforced field
    otherwise (no cloud call was made)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def digest(value: Any) -> str:
    """A short stable digest of a class's value (status.class.fields), to tell later which
    of its fields changed."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def changed_fields(used: Mapping[str, Any], use: ClassUse) -> frozenset[str]:
    """The top-level spec fields ("spec.network") whose value from the class is not the one
    the last pass applied (`used`: status.class): every field from the class when it
    applied another class or none."""
    fields = use.digests
    if used.get("name") != use.name:
        return frozenset(f"spec.{name}" for name in fields)
    before = used.get("fields") or {}
    return frozenset(f"spec.{name}" for name, value in fields.items() if before.get(name) != value)
