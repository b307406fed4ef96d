"""Cloud clients, one per kind, and the few helpers they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.cloud.base import ExternalClient, FieldDiff

if TYPE_CHECKING:
    from provisioner.cloud.aws import Aws

# Tags AWS puts on resources itself; users cannot set or remove them.
AWS_TAG_PREFIX = "aws:"


def visible_tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if not k.startswith(AWS_TAG_PREFIX)}


def tag_diffs(observed: dict[str, str], desired: dict[str, str]) -> list[FieldDiff]:
    """One "tags" diff when the cloud's tags (minus AWS-managed ones) are not exactly `desired`."""
    current = visible_tags(observed)
    return [] if current == desired else [FieldDiff("tags", current, desired)]


def tag_changes(
    observed: dict[str, str], desired: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(tags to add or overwrite, keys to remove) turning `observed` into `desired`."""
    current = visible_tags(observed)
    to_set = {k: v for k, v in desired.items() if current.get(k) != v}
    return to_set, sorted(k for k in current if k not in desired)


def make_clients(aws: Aws) -> dict[str, ExternalClient]:
    """One client per kind, keyed by the custom resource's kind."""
    # Imported here: the client modules import the helpers above from this package.
    from provisioner.cloud.rds import RdsClient
    from provisioner.cloud.s3 import S3Client
    from provisioner.cloud.sqs import SqsClient

    clients: list[ExternalClient] = [RdsClient(aws), S3Client(aws), SqsClient(aws)]
    return {client.kind: client for client in clients}
