"""The registry: every kind the operator serves, one descriptor each (in the kind's module).

Handler registration, spec parsing, error classification, `provisioner leaks`, the
demo, the LocalStack tests, the chart's RBAC check, the benchmark and the soak all
iterate `KINDS`; adding a kind is one line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.aws.session import Aws, AwsSettings, merge_codes
from provisioner.kinds import rds, s3, sns, sqs
from provisioner.kinds.contract import ExternalClient, KindDescriptor
from provisioner.model.resource import Resource

KINDS: tuple[KindDescriptor, ...] = (rds.KIND, s3.KIND, sqs.KIND, sns.KIND)

BY_KIND: Mapping[str, KindDescriptor] = {k.kind: k for k in KINDS}
BY_PLURAL: Mapping[str, KindDescriptor] = {k.plural: k for k in KINDS}
PLURALS: Mapping[str, str] = {k.kind: k.plural for k in KINDS}


def descriptor(kind: str) -> KindDescriptor:
    try:
        return BY_KIND[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(BY_KIND)}") from None


# The shared AWS error codes plus every kind's own.
ERROR_CODES = merge_codes([k.error_codes for k in KINDS])


def make_aws(settings: AwsSettings) -> Aws:
    """One shared AWS session that knows every kind's error codes."""
    return Aws(settings, ERROR_CODES)


def make_clients(aws: Aws) -> dict[str, ExternalClient]:
    """One client per kind, keyed by the custom resource's kind."""
    return {k.kind: k.client(aws) for k in KINDS}


def parse(body: Mapping[str, Any], *, region: str, cluster_id: str) -> Resource:
    """A custom resource's body as the reconciler sees it."""
    return Resource.from_body(body, descriptor(body["kind"]), region=region, cluster_id=cluster_id)
