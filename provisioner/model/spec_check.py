"""A ResourceClass's defaults checked against its kind's spec schema, as the installed CRD
has it (read at start: provisioner/model/schema_defaults.py): a field name the kind does
not have, at any depth, a wrong type, a value out of range. Rules across fields (CEL) are
the API server's alone: a resource that combines a class's value with one of its own in a
way they refuse is refused by the cloud, as InvalidSpec."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from provisioner.model import schema_defaults


def _strict(schema: Any) -> Any:
    """`schema` with every object that lists its properties closed to others (the API
    server prunes unknown fields; here they are named instead)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def problems(kind: str, defaults: Mapping[str, Any]) -> list[str] | None:
    """What is wrong with `defaults` as top-level spec fields of `kind` ([] when nothing;
    None when the kind's schema was not read)."""
    spec = schema_defaults.spec_schema(kind)
    if spec is None:
        return None
    from jsonschema import Draft7Validator  # type: ignore[import-untyped]  # when needed

    properties = spec.get("properties") or {}
    schema = {
        "type": "object",
        "properties": {
            k: _strict(copy.deepcopy(properties[k])) for k in defaults if k in properties
        },
    }
    found = []
    for name in sorted(set(defaults) - set(properties)):
        found.append(f"spec.defaults.{name}: {kind} has no such field")
    for error in sorted(Draft7Validator(schema).iter_errors(dict(defaults)), key=str):
        where = ".".join(str(p) for p in error.absolute_path)
        found.append(f"spec.defaults.{where}: {error.message}")
    return found
