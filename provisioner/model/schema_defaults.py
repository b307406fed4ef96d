"""The defaults of the installed CRDs, applied to a spec recorded before they existed.

The API server fills a field's schema default into every object it returns, stored before
the field existed or not. kopf's last-handled configuration (status.kopf) is a copy of a
spec as a pass saw it: one written by a release without a field lacks it, while the same
resource read now has it, at its default. Compared as they are, every resource would look
changed after an upgrade that adds a defaulted field (a status write each, and the new
field taken for a requested change where it is drift). `last_handled_at_hub` reads such a
record as the API server would serve it today: converted to the hub version, then
defaulted by the spec schema of the installed CRD, as the operator read it at start
(`remember`; unread, for want of the right to read CRDs, nothing is filled in).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from provisioner.model import conversion

# kind -> the spec schema (openAPIV3Schema.properties.spec) of the version the operator
# watches, as the installed CRD has it.
_SPEC_SCHEMAS: dict[str, Mapping[str, Any]] = {}


def remember(crd: Mapping[str, Any], version: str) -> None:
    """Keeps the spec schema of `version` of `crd` (a CRD as the API server returns it)."""
    spec = crd.get("spec") or {}
    kind = str((spec.get("names") or {}).get("kind") or "")
    for entry in spec.get("versions") or []:
        if entry.get("name") == version:
            schema = ((entry.get("schema") or {}).get("openAPIV3Schema") or {}).get(
                "properties", {}
            )
            if kind and isinstance(schema.get("spec"), Mapping):
                _SPEC_SCHEMAS[kind] = schema["spec"]


def forget() -> None:
    _SPEC_SCHEMAS.clear()


def with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` with the defaults of `schema` filled in where a field is absent, at every
    depth, as the API server's structural defaulting does (a default is itself defaulted).
    Never mutates `value`."""
    if isinstance(value, Mapping):
        properties = schema.get("properties") or {}
        out = dict(value)
        for name, sub in properties.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out and out[name] is not None:
                out[name] = with_defaults(out[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name in out.keys() - properties.keys():
                out[name] = with_defaults(out[name], extra)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def field_default(kind: str, name: str) -> tuple[bool, Any]:
    """(True, the value the API server fills into spec.<name> when it is left out, defaulted
    at every depth), or (False, None) when it fills nothing (or the schema is unread)."""
    schema = (_SPEC_SCHEMAS.get(kind) or {}).get("properties", {}).get(name)
    if not isinstance(schema, Mapping) or "default" not in schema:
        return False, None
    return True, with_defaults(copy.deepcopy(schema["default"]), schema)


def spec_schema(kind: str) -> Mapping[str, Any] | None:
    """The spec schema of `kind` in the installed CRD (None: unread)."""
    return _SPEC_SCHEMAS.get(kind)


def spec_fields(kind: str) -> frozenset[str] | None:
    """The top-level spec fields of `kind` in the installed CRD (None: unread)."""
    schema = _SPEC_SCHEMAS.get(kind)
    if schema is None:
        return None
    return frozenset(schema.get("properties") or {})


def spec_with_defaults(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    schema = _SPEC_SCHEMAS.get(kind)
    return dict(with_defaults(spec, schema) if schema else spec)


def last_handled_at_hub(essence: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """kopf's last-handled essence ({spec, metadata}) as the API server would serve it now."""
    hub = conversion.essence_to_hub(essence, kind)
    if isinstance(hub.get("spec"), Mapping):
        hub["spec"] = spec_with_defaults(kind, hub["spec"])
    return hub


def _fixed(schema: Any) -> bool:
    """Whether a rule in `schema`, at any depth, keeps a value from changing (== oldSelf)."""
    if isinstance(schema, Mapping):
        for rule in schema.get("x-kubernetes-validations") or []:
            text = str(rule.get("rule") or "")
            if "== oldSelf" in text or "oldSelf ==" in text:
                return True
        return any(_fixed(v) for k, v in schema.items() if k != "x-kubernetes-validations")
    if isinstance(schema, list):
        return any(_fixed(v) for v in schema)
    return False


def immutable_fields(kind: str) -> frozenset[str]:
    """The top-level spec fields of `kind` that are immutable, whole or in part, in the
    installed CRD (none when it is unread)."""
    properties = (_SPEC_SCHEMAS.get(kind) or {}).get("properties") or {}
    return frozenset(name for name, sub in properties.items() if _fixed(sub))
