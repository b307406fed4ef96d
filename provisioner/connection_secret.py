"""Connection Secrets: next to the CR, owned by it, written only when their content changes."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets as _secrets
import string
from typing import Any
from urllib.parse import quote

from provisioner import API_VERSION, GROUP
from provisioner.models import Resource

HASH_ANNOTATION = f"{GROUP}/content-hash"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "provisioner"
OWNER_KIND_LABEL = f"{GROUP}/owner-kind"
OWNER_NAME_LABEL = f"{GROUP}/owner-name"

# Letters and digits only: accepted by every RDS engine and safe in a URI unescaped.
PASSWORD_ALPHABET = string.ascii_letters + string.digits
PASSWORD_LENGTH = 32


class SecretConflict(RuntimeError):
    """A Secret of that name exists and belongs to something else."""


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
            "annotations": {HASH_ANNOTATION: content_hash(data)},
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
            "choose another spec.writeConnectionSecretToRef.name or remove that Secret"
        )
    annotations = existing.get("metadata", {}).get("annotations") or {}
    if annotations.get(HASH_ANNOTATION) != content_hash(data):
        return True
    # The hash annotation matches; make sure nobody edited the values behind it.
    return content_hash(decode(existing)) != content_hash(data)
