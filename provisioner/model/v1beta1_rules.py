"""v1beta1's rules for the fields a v1alpha1 object carries in its annotation.

The API server checks an object against the schema of the version it was written at. One
written at v1alpha1 is checked against v1alpha1's schema, where the annotation
`cloud.provisioner.dev/v1beta1-fields` is a string like any other, and is stored at v1beta1
through the conversion webhook, which nothing checks afterwards. So the conversion checks what
it lifts out of the annotation against v1beta1's rules itself: this table holds them, with the
messages the API server gives for the same value written at v1beta1 (the CRDs' CEL messages
word for word; for schema constraints, the API server's wording without the value).
tests/unit/test_conversion.py compares every entry with the v1beta1 schemas in crds/*.yaml.

The checks are linear in the size of the value: lengths are checked before patterns, and no
pattern is built from the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The values a Secret template (spec.connectionSecret.keys) may name, per kind.
VALUES: dict[str, tuple[str, ...]] = {
    "DatabaseInstance": (
        "host",
        "port",
        "username",
        "password",
        "database",
        "engine",
        "arn",
        "uri",
        "passwordSecretArn",
    ),
    "S3Bucket": ("bucket", "region", "arn", "endpoint", "kmsKeyId"),
    "Queue": ("queueUrl", "queueArn", "queueName", "region", "kmsKeyId"),
    "Topic": ("topicArn", "topicName", "region", "kmsKeyId"),
}
KINDS = tuple(VALUES)
# A template of each kind, shown in the CRD's description of spec.connectionSecret.keys.
EXAMPLES: dict[str, str] = {
    "DatabaseInstance": "{{ .uri }}",
    "S3Bucket": "s3://{{ .bucket }}",
    "Queue": "{{ .queueUrl }}",
    "Topic": "{{ .topicArn }}",
}

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# A template: text without braces, and placeholders `{{ .value }}` (RE2 syntax, as in CEL).
TEMPLATE_PATTERN = r"^([^{}]|\{\{ *\.(%s) *\}\})*$"
CREDENTIAL_PATTERN = r"\{\{ *\.(password|uri) *\}\}"
IOPS_TYPES = ("io1", "io2", "gp3")
NEEDS_IOPS = ("io1", "io2")

KEY_MESSAGE = "spec.connectionSecret.keys: a key is 1 to 253 of a-z, A-Z, 0-9, '-', '_' and '.'"
CREDENTIAL_MESSAGE = (
    "spec.connectionSecret.keys: at least one template must name {{ .password }} or "
    "{{ .uri }}: the operator keeps the master password only in this Secret"
)
KEPT_MESSAGE = (
    "spec.connectionSecret.keys: with spec.masterPassword.managedBy SecretsManager no template "
    "may name {{ .password }} or {{ .uri }}: the password is in Secrets Manager "
    "({{ .passwordSecretArn }} names the secret)"
)
IOPS_TYPE_MESSAGE = "spec.storage.iops needs spec.storage.type io1, io2 or gp3"
TYPE_IOPS_MESSAGE = "spec.storage.type io1 and io2 need spec.storage.iops"

JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int in Python, never in JSON
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (dict, "object"),
    (list, "array"),
    (type(None), "null"),
)


class RuleError(ValueError):
    """A value that breaks a v1beta1 rule; the message is the rule's, one line."""


@dataclass(frozen=True)
class Cel:
    """A CEL rule of the CRD (x-kubernetes-validations): its text, its message, and the same
    rule as a predicate on the node's value."""

    rule: str
    message: str
    holds: Callable[[Any], bool]
    # A rule on a map's keys alone: checked before the values, whose paths name their keys.
    on_keys: bool = False


@dataclass(frozen=True)
class Schema:
    """A node of the v1beta1 schema, with the constraints the CRD gives it."""

    type: str
    properties: Mapping[str, Schema] = field(default_factory=dict)
    values: Schema | None = None  # additionalProperties: every value of a map
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_properties: int | None = None
    rules: tuple[Cel, ...] = ()


def json_type(value: Any) -> str:
    for python, name in JSON_TYPES:
        if isinstance(value, python):
            return name
    return type(value).__name__


def _matches(pattern: str, text: str) -> bool:
    """RE2's `matches` of an anchored pattern (`^...$`): the whole text, no final newline."""
    return re.fullmatch(pattern, text) is not None


def _cel_string(pattern: str) -> str:
    """`pattern` as a CEL string literal (single quotes, backslashes escaped)."""
    return "'" + pattern.replace("\\", "\\\\") + "'"


def template_message(kind: str) -> str:
    named = ", ".join("{{ ." + value + " }}" for value in VALUES[kind])
    return f"spec.connectionSecret.keys: a template may name only {named}"


def template_pattern(kind: str) -> str:
    return TEMPLATE_PATTERN % "|".join(VALUES[kind])


def _key_rule() -> Cel:
    def holds(keys: Mapping[str, Any]) -> bool:
        return all(len(k) <= 253 and _matches(KEY_PATTERN, k) for k in keys)

    text = f"self.all(k, size(k) <= 253 && k.matches({_cel_string(KEY_PATTERN)}))"
    return Cel(text, KEY_MESSAGE, holds, on_keys=True)


def _template_rule(kind: str) -> Cel:
    pattern = re.compile(template_pattern(kind))

    def holds(keys: Mapping[str, Any]) -> bool:
        return all(not isinstance(t, str) or pattern.fullmatch(t) for t in keys.values())

    text = f"self.all(k, self[k].matches({_cel_string(template_pattern(kind))}))"
    return Cel(text, template_message(kind), holds)


def keeper_template_problem(kind: str, templates: Mapping[str, Any], kept: bool) -> str:
    """The DatabaseInstance spec rules on templates and who keeps the master password (the
    CRD's CEL rules on spec, v1beta1): "" when they hold, else the rule's message. `kept`:
    Secrets Manager keeps the password, so no template may carry one; else one must."""
    if kind != "DatabaseInstance" or not templates:
        return ""
    pattern = re.compile(CREDENTIAL_PATTERN)
    carries = any(isinstance(t, str) and pattern.search(t) for t in templates.values())
    if kept and carries:
        return KEPT_MESSAGE
    if not kept and not carries:
        return CREDENTIAL_MESSAGE
    return ""


def kept_by_spec(spec: Mapping[str, Any]) -> bool:
    """spec.masterPassword.managedBy is SecretsManager."""
    keeper = spec.get("masterPassword")
    return isinstance(keeper, Mapping) and keeper.get("managedBy") == "SecretsManager"


IOPS_NEEDS_TYPE = Cel(
    "!has(self.iops) || (has(self.type) && self.type in ['io1', 'io2', 'gp3'])",
    IOPS_TYPE_MESSAGE,
    lambda storage: "iops" not in storage or storage.get("type") in IOPS_TYPES,
)
TYPE_NEEDS_IOPS = Cel(
    "!has(self.type) || !(self.type in ['io1', 'io2']) || has(self.iops)",
    TYPE_IOPS_MESSAGE,
    lambda storage: storage.get("type") not in NEEDS_IOPS or "iops" in storage,
)


def connection_secret(kind: str) -> Schema:
    rules = [_key_rule(), _template_rule(kind)]
    return Schema(
        "object",
        properties={
            "name": Schema("string", min_length=1, max_length=253, pattern=NAME_PATTERN),
            "keys": Schema(
                "object",
                values=Schema("string", max_length=1024),
                max_properties=50,
                rules=tuple(rules),
            ),
        },
    )


STORAGE = Schema(
    "object",
    properties={
        "sizeGiB": Schema("integer", minimum=20, maximum=65536),
        "type": Schema("string", enum=("gp2", "gp3", "io1", "io2", "standard")),
        "iops": Schema("integer", minimum=1000, maximum=256000),
    },
    rules=(IOPS_NEEDS_TYPE, TYPE_NEEDS_IOPS),
)

# Per kind: the spec fields that may arrive through the annotation, and their schemas.
LIFTED: dict[str, dict[str, Schema]] = {
    kind: {"connectionSecret": connection_secret(kind)}
    | ({"storage": STORAGE} if kind == "DatabaseInstance" else {})
    for kind in KINDS
}


def check(fields: Mapping[str, Any], kind: str, spec: Mapping[str, Any] | None = None) -> None:
    """Raise RuleError with the rule's message when `fields` (spec fields by name, as the
    annotation holds them) break a v1beta1 rule of `kind`; `spec`: the rest of the spec,
    for the rules on the spec as a whole."""
    known = LIFTED[kind]
    for name, value in fields.items():
        if name not in known:
            raise RuleError(_unknown("spec", name, known, "the annotation carries only"))
        _check(known[name], value, f"spec.{name}")
    templates = (fields.get("connectionSecret") or {}).get("keys") or {}
    problem = keeper_template_problem(kind, templates, kept_by_spec(spec or {}))
    if problem:
        raise RuleError(problem)


def _check(schema: Schema, value: Any, path: str) -> None:
    _check_type(schema, value, path)
    if schema.type == "object":
        _check_object(schema, value, path)
    elif schema.type == "string":
        _check_string(schema, value, path)
    elif schema.type == "integer":
        _check_integer(schema, value, path)
    for rule in schema.rules:
        if not rule.holds(value):
            raise RuleError(rule.message)


def _check_type(schema: Schema, value: Any, path: str) -> None:
    found = json_type(value)
    if found != schema.type:
        raise RuleError(f'{path} in body must be of type {schema.type}: "{found}"')


def _check_object(schema: Schema, value: Mapping[str, Any], path: str) -> None:
    if schema.max_properties is not None and len(value) > schema.max_properties:
        too_many = f"Too many: {len(value)}: must have at most {schema.max_properties} items"
        raise RuleError(f"{path}: {too_many}")
    if schema.values is not None:
        for rule in schema.rules:
            if rule.on_keys and not rule.holds(value):
                raise RuleError(rule.message)
        for key, item in value.items():
            _check(schema.values, item, f"{path}.{key}")
        return
    for name, item in value.items():
        if name not in schema.properties:
            raise RuleError(_unknown(path, name, schema.properties, f"{path} has only"))
        _check(schema.properties[name], item, f"{path}.{name}")


def _check_string(schema: Schema, value: str, path: str) -> None:
    if schema.min_length is not None and len(value) < schema.min_length:
        raise RuleError(f"{path} in body should be at least {schema.min_length} chars long")
    if schema.max_length is not None and len(value) > schema.max_length:
        raise RuleError(f"{path}: Too long: may not be more than {schema.max_length} bytes")
    if schema.pattern is not None and not _matches(schema.pattern, value):
        raise RuleError(f"{path} in body should match '{schema.pattern}'")
    if schema.enum is not None and value not in schema.enum:
        supported = ", ".join(f'"{v}"' for v in schema.enum)
        raise RuleError(f"{path}: Unsupported value: supported values: {supported}")


def _check_integer(schema: Schema, value: int, path: str) -> None:
    if schema.minimum is not None and value < schema.minimum:
        raise RuleError(f"{path} in body should be greater than or equal to {schema.minimum}")
    if schema.maximum is not None and value > schema.maximum:
        raise RuleError(f"{path} in body should be less than or equal to {schema.maximum}")


def _unknown(path: str, name: str, known: Mapping[str, Any], only: str) -> str:
    """An unknown field, named only when the name is plain (it comes from the request)."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,62}", name) is not None
    where = f'"{path}.{name}"' if plain else f"in {path}"
    return f"unknown field {where} ({only} {', '.join(known)})"
