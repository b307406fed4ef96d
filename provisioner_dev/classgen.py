"""The chart's admission policies around ResourceClasses, written from the four kinds' CRDs
into deploy/helm/provisioner/templates/resource-classes.yaml:

- on ResourceClasses: a field in `spec.defaults` or `spec.enforced` that the class's kind
  does not have (or that a class never sets: provisioner/model/classes.py NEVER_FROM_CLASS
  and the kind's name field), at the top level or one level down, is refused at apply (the
  CRD cannot say it: CEL in a CRD does not see the keys of fields of any type);
- one per kind, with the ResourceClasses as its parameters, refusing a resource that sets an
  enforced field otherwise ("spec.network is set by ResourceClass prod-postgres"). A field at
  its schema default counts as unset there too, as in the operator.

    python -m provisioner_dev.classgen          # rewrite it
    python -m provisioner_dev.classgen --check  # exit 1 when it is stale

tests/unit/test_classgen.py fails when it differs from what this writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from provisioner.kinds.registry import KINDS
from provisioner.model.classes import NEVER_FROM_CLASS

ROOT = Path(__file__).resolve().parents[1]
POLICY_FILE = ROOT / "deploy" / "helm" / "provisioner" / "templates" / "resource-classes.yaml"


def spec_schema(plural: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "crds" / f"{plural}.yaml").read_text())
    (entry,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1beta1"]
    return dict(entry["schema"]["openAPIV3Schema"]["properties"]["spec"])


def class_fields() -> dict[str, list[str]]:
    """Kind -> the top-level spec fields a class may set, sorted."""
    return {
        k.kind: sorted(set(spec_schema(k.plural)["properties"]) - NEVER_FROM_CLASS - {k.name_field})
        for k in KINDS
    }


def _cel(value: Any) -> str:
    """A JSON value as a CEL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_cel(k)}: {_cel(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_cel(v) for v in value) + "]"
    if isinstance(value, str):
        return _quote(value)
    return "null" if value is None else json.dumps(value)


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _defaulted(schema: dict[str, Any]) -> Any:
    from provisioner.model.schema_defaults import with_defaults

    return with_defaults(schema["default"], schema)


def _set_otherwise(name: str, schema: dict[str, Any]) -> str:
    """CEL: the resource sets spec.<name> otherwise than the class (param) enforces it."""
    is_set = f"has(object.spec.{name})"
    if "default" in schema:
        is_set += f" && object.spec.{name} != {_cel(_defaulted(schema))}"
    same = (
        f"has(params.spec.defaults) && {_quote(name)} in params.spec.defaults"
        f" && object.spec.{name} == params.spec.defaults[{_quote(name)}]"
    )
    return f"({_quote(name)} in variables.enforced && {is_set} && !({same}))"


SELECTS = """\
has(params.spec.namespaceSelector)
&& (size(params.spec.namespaceSelector.?matchLabels.orValue({}))
    + size(params.spec.namespaceSelector.?matchExpressions.orValue([])) > 0)
&& params.spec.namespaceSelector.?matchLabels.orValue({}).all(k,
    k in variables.labels && variables.labels[k] == params.spec.namespaceSelector.matchLabels[k])
&& params.spec.namespaceSelector.?matchExpressions.orValue([]).all(e,
    e.operator == 'In' ? (e.key in variables.labels && variables.labels[e.key] in e.values)
    : e.operator == 'NotIn' ? !(e.key in variables.labels && variables.labels[e.key] in e.values)
    : e.operator == 'Exists' ? e.key in variables.labels
    : !(e.key in variables.labels))"""

APPLIES = """\
params.spec.kind == object.kind
&& (has(object.spec.className) ? object.spec.className == params.metadata.name
    : (params.spec.?default.orValue(false) && variables.selects))"""


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "\n".join(pad + line for line in text.splitlines())


def policy(kind: str, plural: str, fields: list[str]) -> str:
    schema = spec_schema(plural)["properties"]
    violated = "\n+ ".join(f"({_set_otherwise(n, schema[n])} ? [{_quote(n)}] : [])" for n in fields)
    name = f"{{{{ $fullname }}}}-class-{plural}"
    return f"""\
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
  labels:
    {{{{- include "provisioner.labels" . | nindent 4 }}}}
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: cloud.provisioner.dev/v1beta1
    kind: ResourceClass
  matchConstraints:
    resourceRules:
      - apiGroups: [cloud.provisioner.dev]
        apiVersions: [v1beta1]
        operations: [CREATE, UPDATE]
        resources: [{plural}]
    # A v1alpha1 request is converted to v1beta1 first (the fields are the same at both).
    matchPolicy: Equivalent
  variables:
    - name: labels
      expression: namespaceObject.metadata.?labels.orValue({{}})
    - name: selects
      expression: >-
{_block(SELECTS, 8)}
    - name: applies
      expression: >-
{_block(APPLIES, 8)}
    - name: enforced
      expression: params.spec.?enforced.orValue([])
    - name: violated
      expression: >-
{_block("[] + " + violated, 8)}
  validations:
    - expression: "!variables.applies || size(variables.violated) == 0"
      messageExpression: >-
        variables.violated.map(f, 'spec.' + f + ' is set by ResourceClass '
        + params.metadata.name).join('; ')
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
  labels:
    {{{{- include "provisioner.labels" . | nindent 4 }}}}
spec:
  policyName: {name}
  validationActions: [Deny]
  paramRef:
    selector: {{}}
    parameterNotFoundAction: Allow
"""


def policies() -> str:
    head = """\
{{- $fullname := include "provisioner.fullname" . }}
{{- if .Values.resourceClasses.enforce }}
# Written by `python -m provisioner_dev.classgen` from the kinds' CRDs: do not edit.
# A resource that sets a field its ResourceClass enforces otherwise is refused at
# `kubectl apply` ("spec.network is set by ResourceClass prod-postgres"). Without these
# policies the operator refuses it instead (Synced=False, InvalidSpec).
"""
    fields = class_fields()
    body = "".join(policy(k.kind, k.plural, fields[k.kind]) for k in KINDS)
    return head + defaults_policy() + body + "{{- end }}\n"


def _names_check(kind: str, names: list[str], properties: dict[str, Any]) -> list[str]:
    """CEL validations of a ResourceClass (the object, dyn) for `kind`: its defaults' and
    enforced fields are top-level fields a class of the kind may set, and each default
    that is an object names only fields of that object (one level down)."""
    listed = "[" + ", ".join(_quote(n) for n in names) + "]"
    given = "object.spec.?defaults.orValue({})"
    checks = [
        f"""\
    - expression: >-
        object.spec.kind != '{kind}'
        || {given}.all(f, f in {listed})
      messageExpression: >-
        {given}.filter(f, !(f in {listed}))
        .map(f, 'spec.defaults.' + f).join(', ')
        + ': not a field a {kind} class may set ({", ".join(names)})'
      reason: Invalid
    - expression: >-
        object.spec.kind != '{kind}'
        || object.spec.?enforced.orValue([]).all(f, f in {listed})
      messageExpression: >-
        'spec.enforced: ' + object.spec.enforced.filter(f, !(f in {listed})).join(', ')
        + ': not a field a {kind} class may set'
      reason: Invalid
"""
    ]
    for name in names:
        inner = sorted((properties[name].get("properties") or {}).keys())
        if not inner or properties[name].get("additionalProperties"):
            continue
        known = "[" + ", ".join(_quote(n) for n in inner) + "]"
        value = f"{given}[{_quote(name)}]"
        checks.append(
            f"""\
    - expression: >-
        object.spec.kind != '{kind}' || !({_quote(name)} in {given})
        || type({value}) != map || {value}.all(k, k in {known})
      messageExpression: >-
        {value}.filter(k, !(k in {known}))
        .map(k, 'spec.defaults.{name}.' + k).join(', ')
        + ': not a field of {kind} spec.{name} ({", ".join(inner)})'
      reason: Invalid
"""
        )
    return checks


def defaults_policy() -> str:
    """The policy on ResourceClasses themselves: field names in defaults and enforced."""
    fields = class_fields()
    checks = []
    for k in KINDS:
        checks += _names_check(k.kind, fields[k.kind], spec_schema(k.plural)["properties"])
    name = "{{ $fullname }}-class-defaults"
    return f"""\
---
# A ResourceClass naming a field its kind does not have (or that a class never sets) in
# spec.defaults or spec.enforced, at the top level or one level down, is refused at apply.
# The operator checks the whole of spec.defaults against the kind's schema as well
# (the class's Ready condition).
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
  labels:
    {{{{- include "provisioner.labels" . | nindent 4 }}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [cloud.provisioner.dev]
        apiVersions: [v1beta1]
        operations: [CREATE, UPDATE]
        resources: [resourceclasses]
  validations:
{"".join(checks)}---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
  labels:
    {{{{- include "provisioner.labels" . | nindent 4 }}}}
spec:
  policyName: {name}
  validationActions: [Deny]
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioner_dev.classgen")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in ((POLICY_FILE, policies()),):
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale (run python -m provisioner_dev.classgen): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
