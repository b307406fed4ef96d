"""Connection Secrets: next to the CR, owned by it, written only when their content changes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets as _secrets
import string
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from provisioner import API_VERSION, GROUP
from provisioner.model.resource import Resource, label_value

HASH_ANNOTATION = f"{GROUP}/content-hash"
# Where the master password sits in the data ({"key", "offset", "length"}), so that it can be
# found again after a template change without reading any template or pattern from the Secret.
PASSWORD_AT_ANNOTATION = f"{GROUP}/password-at"
# {{ .host }}: the CRD's CEL rule allows these placeholders and nothing else between braces.
PLACEHOLDER = re.compile(r"\{\{ *\.([A-Za-z]+) *\}\}")
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "provisioner"
OWNER_KIND_LABEL = f"{GROUP}/owner-kind"
OWNER_NAME_LABEL = f"{GROUP}/owner-name"  # models.label_value of the name

# Letters and digits only: accepted by every RDS engine and safe in a URI unescaped.
PASSWORD_ALPHABET = string.ascii_letters + string.digits
PASSWORD_LENGTH = 32
# What a password found again in a Secret may look like (generated ones are PASSWORD_LENGTH).
MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 128


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


def stored_password(
    secret: dict[str, Any],
    templates: Mapping[str, str],
    fill: Callable[[str], dict[str, str]] | None = None,
) -> str | None:
    """The master password in a connection Secret, or None when it cannot be found.

    Nothing read from the Secret becomes a pattern or a template: the Secret only says where
    the password sits (`PASSWORD_AT_ANNOTATION`: a key, an offset and a length, checked
    against the data), and a Secret without that annotation is read against `templates`,
    the resource's own spec, filled by `fill` (the cloud's values with a given password).
    Both ways take time linear in the Secret's size.
    """
    data = decode(secret)
    annotations = secret.get("metadata", {}).get("annotations") or {}
    found = _at_recorded_place(data, annotations.get(PASSWORD_AT_ANNOTATION))
    if found:
        return found
    if not templates:
        password = data.get("password") or ""
        return password if _is_password(password) else None
    return _rendered_from(data, templates, fill) if fill else None


def password_location(data: Mapping[str, str], password: str) -> str | None:
    """Where `password` sits in `data` (the annotation's value), or None if nowhere."""
    for key in sorted(data):
        offset = data[key].find(password)
        if offset >= 0:
            return json.dumps({"key": key, "offset": offset, "length": len(password)})
    return None


def _is_password(text: str) -> bool:
    return MIN_PASSWORD_LENGTH <= len(text) <= MAX_PASSWORD_LENGTH and all(
        c in PASSWORD_ALPHABET for c in text
    )


def _at_recorded_place(data: Mapping[str, str], recorded: str | None) -> str | None:
    if not recorded or len(recorded) > 1024:
        return None
    try:
        place = json.loads(recorded)
    except ValueError:
        return None
    if not isinstance(place, dict):
        return None
    key, offset, length = place.get("key"), place.get("offset"), place.get("length")
    if not (isinstance(key, str) and isinstance(offset, int) and isinstance(length, int)):
        return None
    value = data.get(key) or ""
    if offset < 0 or length <= 0:
        return None
    candidate = value[offset : offset + length]
    return candidate if len(candidate) == length and _is_password(candidate) else None


def _rendered_from(
    data: Mapping[str, str], templates: Mapping[str, str], fill: Callable[[str], dict[str, str]]
) -> str | None:
    """The password in data rendered from `templates`: each value is the template filled with
    the known values, split where the password goes; the password is what fills the gaps."""
    marker = generate_password()
    try:
        rendered = render(dict(templates), fill(marker))
    except TemplateError:
        return None
    for key in sorted(rendered):
        value = data.get(key)
        parts = rendered[key].split(marker)
        gaps = len(parts) - 1
        if value is None or not gaps:
            continue
        room = len(value) - sum(len(part) for part in parts)
        if room <= 0 or room % gaps:
            continue
        start = len(parts[0])
        candidate = value[start : start + room // gaps]
        if _is_password(candidate) and candidate.join(parts) == value:
            return candidate
    return None


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


def own_annotations(data: Mapping[str, str], password: str | None = None) -> dict[str, str]:
    """The annotations the operator keeps on a connection Secret for `data`."""
    annotations = {HASH_ANNOTATION: content_hash(dict(data))}
    if password and (place := password_location(data, password)):
        annotations[PASSWORD_AT_ANNOTATION] = place
    return annotations


def build(resource: Resource, data: dict[str, str], password: str | None = None) -> dict[str, Any]:
    annotations = own_annotations(data, password)
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
                OWNER_NAME_LABEL: label_value(resource.name),
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


def needs_write(
    existing: dict[str, Any] | None,
    resource: Resource,
    data: dict[str, str],
    password: str | None = None,
) -> bool:
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
    wanted = own_annotations(data, password)
    if any(annotations.get(key) != value for key, value in wanted.items()):
        return True
    # The hash annotation matches; make sure nobody edited the values behind it.
    return content_hash(decode(existing)) != content_hash(data)
