"""Connection Secrets: next to the CR, owned by it, written only when their content changes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets as _secrets
import string
from typing import Any
from urllib.parse import quote

from provisioner import API_VERSION, GROUP
from provisioner.models import Resource

HASH_ANNOTATION = f"{GROUP}/content-hash"
# The templates (spec.connectionSecret.keys) the data was rendered with; no values, so that
# the master password can be found again in the Secret after a template change.
TEMPLATE_ANNOTATION = f"{GROUP}/template"
# {{ .host }}: the CRD's CEL rule allows these placeholders and nothing else between braces.
PLACEHOLDER = re.compile(r"\{\{ *\.([A-Za-z]+) *\}\}")
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "provisioner"
OWNER_KIND_LABEL = f"{GROUP}/owner-kind"
OWNER_NAME_LABEL = f"{GROUP}/owner-name"

# Letters and digits only: accepted by every RDS engine and safe in a URI unescaped.
PASSWORD_ALPHABET = string.ascii_letters + string.digits
PASSWORD_LENGTH = 32


class SecretConflict(RuntimeError):
    """A Secret of that name exists and belongs to something else."""


class TemplateError(ValueError):
    """A template names a value the kind does not have; the message names key and value."""


def render(templates: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """The Secret's data: `values` themselves without templates, else each template filled."""
    if not templates:
        return dict(values)
    out = {}
    for key, template in sorted(templates.items()):

        def fill(match: re.Match[str], key: str = key) -> str:
            name = match.group(1)
            if name not in values:
                raise TemplateError(
                    f"spec.connectionSecret.keys.{key} names {{{{ .{name} }}}}, which this "
                    f"kind does not have; known: {', '.join(sorted(values))}"
                )
            return values[name]

        out[key] = PLACEHOLDER.sub(fill, template)
    return out


def stored_password(secret: dict[str, Any]) -> str | None:
    """The master password in a connection Secret, however its templates spelled it."""
    data = decode(secret)
    annotations = secret.get("metadata", {}).get("annotations") or {}
    try:
        templates = json.loads(annotations.get(TEMPLATE_ANNOTATION) or "{}")
    except ValueError:
        templates = {}
    if not isinstance(templates, dict) or not templates:
        return data.get("password") or None
    for key, template in templates.items():
        if key in data and (found := _password_in(str(template), data[key])):
            return found
    return None


def _password_in(template: str, value: str) -> str | None:
    """The password in `value`, rendered from `template` (via .password or .uri)."""
    pattern, pos, seen = "", 0, False
    for match in PLACEHOLDER.finditer(template):
        pattern += re.escape(template[pos : match.start()])
        name, pos = match.group(1), match.end()
        if name not in ("password", "uri"):
            pattern += ".*?"
            continue
        group = "(?P=pw)" if seen else f"(?P<pw>[{PASSWORD_ALPHABET}]+)"
        pattern += group if name == "password" else f"[a-z]+://[^:/@]*:{group}@.*?"
        seen = True
    pattern += re.escape(template[pos:])
    found = re.fullmatch(pattern, value, re.DOTALL) if seen else None
    return found.group("pw") if found else None


def generate_password(length: int = PASSWORD_LENGTH) -> str:
    return "".join(_secrets.choice(PASSWORD_ALPHABET) for _ in range(length))


def database_uri(engine: str, username: str, password: str, host: str, port: str, db: str) -> str:
    scheme = "postgresql" if engine == "postgres" else "mysql"
    return f"{scheme}://{quote(username, safe='')}:{quote(password, safe='')}@{host}:{port}/{db}"


def content_hash(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def decode(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def owned_by(secret: dict[str, Any], resource: Resource) -> bool:
    refs = secret.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == resource.uid for ref in refs)


def build(resource: Resource, data: dict[str, str]) -> dict[str, Any]:
    annotations = {HASH_ANNOTATION: content_hash(data)}
    if resource.secret_keys:
        annotations[TEMPLATE_ANNOTATION] = json.dumps(resource.secret_keys, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": resource.secret_name,
            "namespace": resource.namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                OWNER_KIND_LABEL: resource.kind,
                OWNER_NAME_LABEL: resource.name,
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": resource.kind,
                    "name": resource.name,
                    "uid": resource.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def needs_write(existing: dict[str, Any] | None, resource: Resource, data: dict[str, str]) -> bool:
    """Whether the Secret must be (re)written; raises SecretConflict for a foreign one."""
    if existing is None:
        return False if not data else True
    if not owned_by(existing, resource):
        raise SecretConflict(
            f"Secret {resource.secret_name} exists and is not owned by this {resource.kind}; "
            "choose another spec.connectionSecret.name (v1alpha1: writeConnectionSecretToRef.name) "
            "or remove that Secret"
        )
    annotations = existing.get("metadata", {}).get("annotations") or {}
    if annotations.get(HASH_ANNOTATION) != content_hash(data):
        return True
    # The hash annotation matches; make sure nobody edited the values behind it.
    return content_hash(decode(existing)) != content_hash(data)
