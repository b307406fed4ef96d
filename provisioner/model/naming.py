"""Deterministic cloud names derived from a custom resource.

A name depends only on the namespace, the name and the uid of the resource, so an
operator that crashed after a create call finds the same resource on its next try.
The short uid hash keeps two resources of the same name in re-created namespaces
(or in two clusters) apart.
"""

from __future__ import annotations

import hashlib
import re


def uid_hash(uid: str, length: int = 8) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()[:length]


def _squash(text: str, allowed: str, sep: str = "-") -> str:
    text = re.sub(f"[^{allowed}]+", sep, text.lower())
    text = re.sub(f"{re.escape(sep)}{{2,}}", sep, text)
    return text.strip(sep + ".")


def _join(prefix: str, suffix: str, limit: int, sep: str = "-") -> str:
    room = limit - len(suffix) - len(sep)
    prefix = prefix[:room].rstrip(sep + "._")
    return f"{prefix}{sep}{suffix}" if prefix else suffix


# Prefixes AWS reserves for bucket names.
RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")


def bucket_name(namespace: str, name: str, uid: str) -> str:
    """A valid S3 bucket name: 3-63 chars of [a-z0-9-], starts and ends alphanumeric."""
    base = _squash(f"{namespace}-{name}", "a-z0-9")
    if not base or base.startswith(RESERVED_BUCKET_PREFIXES) or not base[0].isalnum():
        base = f"b-{base}".rstrip("-")
    return _join(base, uid_hash(uid), 63)


def queue_name(namespace: str, name: str, uid: str, *, fifo: bool) -> str:
    """A valid SQS queue name: up to 80 chars of [A-Za-z0-9_-], `.fifo` counted in."""
    suffix = ".fifo" if fifo else ""
    base = _squash(f"{namespace}-{name}", "a-z0-9_")
    return _join(base, uid_hash(uid), 80 - len(suffix)) + suffix


def db_instance_identifier(namespace: str, name: str, uid: str) -> str:
    """A valid RDS identifier: 1-63 of [a-z0-9-], letter first, no '--', no trailing '-'."""
    base = _squash(f"{namespace}-{name}", "a-z0-9")
    if not base or not base[0].isalpha():
        base = f"d-{base}".rstrip("-")
    return _join(base, uid_hash(uid), 63)


def db_parameter_group_name(namespace: str, name: str, uid: str) -> str:
    """A valid DB parameter group name: 1-255 of [a-z0-9-], letter first, no '--', no
    trailing '-' (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/
    API_CreateDBParameterGroup.html); AWS keeps it in lowercase."""
    base = _squash(f"{namespace}-{name}", "a-z0-9")
    if not base or not base[0].isalpha():
        base = f"p-{base}".rstrip("-")
    return _join(f"{base}-params", uid_hash(uid), 255)
