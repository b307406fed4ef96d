"""The v1beta1 version of the namespaced CRDs, derived from their v1alpha1 version.

crds/{databaseinstances,s3buckets,queues,topics}.yaml serve two versions with one schema but
for the fields v1beta1 changed (provisioner/model/conversion.py lists them):

- every kind: `spec.writeConnectionSecretToRef: {name}` became `spec.connectionSecret:
  {name, keys}`, with CEL rules that allow in the templates of `keys` only the kind's values;
- DatabaseInstance: `spec.allocatedStorageGiB` became `spec.storage: {sizeGiB, type, iops}`.

The v1alpha1 entry is the source: this module rewrites each file as its header, the
`conversion:` stanza (the conversion webhook), the v1alpha1 entry (not the storage version)
and the v1beta1 entry made from it, so that a change to a field both versions share is made
once, in the v1alpha1 entry. v1beta1's own fields (spec.connectionSecret, spec.storage) are
written here. tests/unit/test_crdgen.py fails when a file differs from what it would write.

    python -m provisioner_dev.crdgen          # rewrite crds/*.yaml
    python -m provisioner_dev.crdgen --check  # exit 1 when one is stale

then deploy/sync-crds.sh (the chart's copies) and deploy/render.sh (the plain manifests).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from provisioner.kinds.registry import KINDS
from provisioner.model import v1beta1_rules

ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT / "crds"
OLD, NEW = "v1alpha1", "v1beta1"

# The values a Secret template (spec.connectionSecret.keys) may name, per kind: the table
# the conversion checks them against.
VALUES = v1beta1_rules.VALUES
# Each kind's CRD, named for its plural (crds/<plural>.yaml).
FILES = {k.kind: f"{k.plural}.yaml" for k in KINDS}

CONVERSION = """\
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig:
        service:
          namespace: provisioner-system
          name: provisioner-webhook
          port: 9443
          path: /convert
"""

OLD_NAME_RULE = """\
            - rule: >-
                (has(self.spec.writeConnectionSecretToRef)
                ? self.spec.writeConnectionSecretToRef.name
                : self.metadata.name + '-connection')
                == (has(oldSelf.spec.writeConnectionSecretToRef)
                ? oldSelf.spec.writeConnectionSecretToRef.name
                : oldSelf.metadata.name + '-connection')
              message: spec.writeConnectionSecretToRef.name is immutable
              fieldPath: .spec.writeConnectionSecretToRef
"""
NEW_NAME_RULE = """\
            - rule: >-
                (has(self.spec.connectionSecret) && has(self.spec.connectionSecret.name)
                ? self.spec.connectionSecret.name
                : self.metadata.name + '-connection')
                == (has(oldSelf.spec.connectionSecret) && has(oldSelf.spec.connectionSecret.name)
                ? oldSelf.spec.connectionSecret.name
                : oldSelf.metadata.name + '-connection')
              message: spec.connectionSecret.name is immutable
              fieldPath: .spec.connectionSecret.name
"""

PROPERTY_INDENT = " " * 16

CONNECTION_PROPERTY = """\
connectionSecret:
  description: The Secret, in the resource's own namespace, that receives the connection details.
  type: object
  properties:
    name:
      description: >-
        The Secret's name; defaults to <metadata.name>-connection (for a name over 242
        characters, its first 233, a hash and -connection). Immutable.
      type: string
      minLength: 1
      maxLength: 253
      pattern: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$
    keys:
      description: >-
        The Secret's keys, each with the template of its value, e.g. "{example}".
        Unset: the Secret holds the default keys (docs/api.md); set: exactly these keys.
        A template is text with placeholders {{{{ .name }}}} for these connection details:
        {values}.
      type: object
      maxProperties: 50
      additionalProperties:
        type: string
        maxLength: 1024
      x-kubernetes-validations:
        - rule: self.all(k, size(k) <= 253 && k.matches('^[-._a-zA-Z0-9]+$'))
          message: >-
            spec.connectionSecret.keys: a key is 1 to 253 of a-z, A-Z, 0-9, '-', '_' and '.'
        - rule: >-
            self.all(k,
            self[k].matches('^([^{{}}]|\\\\{{\\\\{{ *\\\\.({alternatives}) *\\\\}}\\\\}})*$'))
          message: 'spec.connectionSecret.keys: a template may name only {placeholders}'
"""
# DatabaseInstance, on its spec (the templates and who keeps the password): the operator keeps
# its master password nowhere but in this Secret; a password Secrets Manager keeps is never in it.
DATABASE_SPEC_RULES = """\
- rule: >-
    !has(self.connectionSecret) || !has(self.connectionSecret.keys)
    || self.connectionSecret.keys.size() == 0
    || (has(self.masterPassword) && has(self.masterPassword.managedBy)
    && self.masterPassword.managedBy == 'SecretsManager')
    || self.connectionSecret.keys.exists(k,
    self.connectionSecret.keys[k].matches('\\\\{\\\\{ *\\\\.(password|uri) *\\\\}\\\\}'))
  message: >-
    spec.connectionSecret.keys: at least one template must name {{ .password }} or
    {{ .uri }}: the operator keeps the master password only in this Secret
  fieldPath: .connectionSecret.keys
- rule: >-
    !(has(self.masterPassword) && has(self.masterPassword.managedBy)
    && self.masterPassword.managedBy == 'SecretsManager')
    || !has(self.connectionSecret) || !has(self.connectionSecret.keys)
    || !self.connectionSecret.keys.exists(k,
    self.connectionSecret.keys[k].matches('\\\\{\\\\{ *\\\\.(password|uri) *\\\\}\\\\}'))
  message: >-
    spec.connectionSecret.keys: with spec.masterPassword.managedBy SecretsManager no template
    may name {{ .password }} or {{ .uri }}: the password is in Secrets Manager ({{
    .passwordSecretArn }} names the secret)
  fieldPath: .connectionSecret.keys
"""
SPEC_RULES_AT = "\n              x-kubernetes-validations:\n"
SPEC_RULE_INDENT = " " * 16
# A template shown in each kind's description of spec.connectionSecret.keys.
EXAMPLES = v1beta1_rules.EXAMPLES

STORAGE = """\
storage:
  description: The DB instance's storage.
  type: object
  default: {}
  x-kubernetes-validations:
    - rule: "!has(self.iops) || (has(self.type) && self.type in ['io1', 'io2', 'gp3'])"
      message: spec.storage.iops needs spec.storage.type io1, io2 or gp3
      fieldPath: .iops
    - rule: "!has(self.type) || !(self.type in ['io1', 'io2']) || has(self.iops)"
      message: spec.storage.type io1 and io2 need spec.storage.iops
      fieldPath: .iops
  properties:
    sizeGiB:
      description: Allocated storage in GiB; may grow, never shrink.
      type: integer
      minimum: 20
      maximum: 65536
      default: 20
      x-kubernetes-validations:
        - rule: self >= oldSelf
          message: spec.storage.sizeGiB may grow but never shrink
    type:
      description: >-
        The storage type; unset: the cloud's choice when the instance is created. Set at
        creation only: the operator does not change it afterwards.
      type: string
      enum: [gp2, gp3, io1, io2, standard]
    iops:
      description: Provisioned IOPS; for type io1 and io2 (required there) and gp3.
      type: integer
      minimum: 1000
      maximum: 256000
"""


class CrdGenError(ValueError):
    """A CRD file does not have the shape the generator expects; the message says where."""


def _indent(block: str, prefix: str) -> str:
    return "".join(prefix + line if line.strip() else line for line in block.splitlines(True))


def connection_secret_property(kind: str) -> str:
    values = VALUES[kind]
    block = CONNECTION_PROPERTY.format(
        values=", ".join(values),
        example=EXAMPLES[kind],
        alternatives="|".join(values),
        placeholders=", ".join("{{ ." + v + " }}" for v in values),
    )
    return _indent(block, PROPERTY_INDENT)


def _replace_property(text: str, name: str, replacement: str) -> str:
    """`text` with the spec property `name` (its line and the deeper ones) replaced."""
    lines = text.splitlines(True)
    head = f"{PROPERTY_INDENT}{name}:\n"
    starts = [i for i, line in enumerate(lines) if line == head]
    if len(starts) != 1:
        raise CrdGenError(f"expected one spec property {name!r}, found {len(starts)}")
    start = end = starts[0]
    end += 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > len(PROPERTY_INDENT)
    ):
        end += 1
    return "".join(lines[:start]) + replacement + "".join(lines[end:])


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise CrdGenError(f"expected {what} once, found it {text.count(old)} times")
    return text.replace(old, new)


def derive(old_entry: str, kind: str) -> str:
    """The v1beta1 entry of `versions` from the v1alpha1 one (both as text)."""
    new = _replace_once(old_entry, f"    - name: {OLD}\n", f"    - name: {NEW}\n", "the name")
    new = _replace_once(new, "      storage: false\n", "      storage: true\n", "storage: false")
    new = _replace_once(new, OLD_NAME_RULE, NEW_NAME_RULE, "the Secret name's rule")
    new = _replace_property(new, "writeConnectionSecretToRef", connection_secret_property(kind))
    if kind == "DatabaseInstance":
        new = _replace_property(new, "allocatedStorageGiB", _indent(STORAGE, PROPERTY_INDENT))
        rules = SPEC_RULES_AT + _indent(DATABASE_SPEC_RULES, SPEC_RULE_INDENT)
        new = _replace_once(new, SPEC_RULES_AT, rules, "the spec's rules")
    for gone in ("writeConnectionSecretToRef", "allocatedStorageGiB"):
        if gone in new:
            raise CrdGenError(f"{gone} is still mentioned in the {NEW} entry")
    return new


def split(text: str) -> tuple[str, dict[str, str]]:
    """(the header before `versions:`, without a conversion stanza; entries by version)."""
    head, sep, rest = text.partition("  versions:\n")
    if not sep:
        raise CrdGenError("no `versions:` in spec")
    conversion = head.find("  conversion:\n")
    if conversion >= 0:
        head = head[:conversion]
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in rest.splitlines(True):
        if line.startswith("    - name: ") and current:
            entries[current[0].split(": ", 1)[1].strip()] = "".join(current)
            current = []
        elif not line.startswith("    ") and line.strip():
            raise CrdGenError(f"expected `versions:` to be the last field of spec: {line!r}")
        current.append(line)
    if current:
        entries[current[0].split(": ", 1)[1].strip()] = "".join(current)
    return head, entries


def render(text: str, kind: str) -> str:
    """The whole file, from the header and v1alpha1 entry of `text`."""
    head, entries = split(text)
    if OLD not in entries:
        raise CrdGenError(f"no {OLD} entry")
    old = entries[OLD]
    if "      storage: true\n" in old:
        old = old.replace("      storage: true\n", "      storage: false\n", 1)
    return head + CONVERSION + "  versions:\n" + old + derive(old, kind)


def stale(directory: Path = CRD_DIR) -> list[Path]:
    return [
        directory / name
        for kind, name in FILES.items()
        if render((directory / name).read_text(), kind) != (directory / name).read_text()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioner_dev.crdgen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which files are stale")
    parser.add_argument("--dir", type=Path, default=CRD_DIR, help="the CRDs (default crds/)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            found = stale(args.dir)
            for path in found:
                print(f"{path} is stale: run python -m provisioner_dev.crdgen", file=sys.stderr)
            return 1 if found else 0
        for kind, name in FILES.items():
            path = args.dir / name
            text = path.read_text()
            rendered = render(text, kind)
            if rendered != text:
                path.write_text(rendered)
                print(f"wrote {path}")
    except CrdGenError as exc:
        print(f"crdgen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
