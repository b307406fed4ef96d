"""`provisioner leaks`: what the cloud and the cluster disagree about.

- leaked: a cloud resource tagged with our cluster id whose owner CR does not exist;
- vanished: a CR that says its resource exists (status.externalName and Ready once)
  while the cloud has nothing of that name and owner.
Resources retained on purpose (deletionPolicy Retain) are leaks by this definition too:
their CR is gone. They are listed with their tags so a platform engineer can decide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from provisioner import API_VERSION
from provisioner.cloud import errors
from provisioner.cloud.aws import classify
from provisioner.kube import PLURALS, Kube
from provisioner.models import CLUSTER_TAG, NAME_TAG, NAMESPACE_TAG, OWNER_UID_TAG

T = TypeVar("T")


@dataclass(frozen=True)
class CloudResource:
    kind: str
    name: str
    tags: dict[str, str]

    @property
    def owner_uid(self) -> str:
        return self.tags.get(OWNER_UID_TAG, "")


@dataclass(frozen=True)
class Finding:
    problem: str  # leaked | vanished
    kind: str
    name: str
    detail: str


class Cloud(Protocol):
    """What the listing needs: `Aws`, or any other source of boto3 clients."""

    def client(self, service: str) -> Any: ...

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...


def _tags(pairs: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in pairs}


def _buckets(cloud: Cloud) -> Iterator[tuple[str, dict[str, str]]]:
    s3 = cloud.client("s3")
    for bucket in cloud.call(s3.list_buckets).get("Buckets", []):
        try:
            tagset = cloud.call(s3.get_bucket_tagging, Bucket=bucket["Name"])["TagSet"]
        except errors.NotFoundError as exc:
            if exc.code != "NoSuchTagSet":
                continue  # deleted since it was listed
            tagset = []
        yield bucket["Name"], _tags(tagset)


def _queues(cloud: Cloud) -> Iterator[tuple[str, dict[str, str]]]:
    sqs = cloud.client("sqs")
    for page in sqs.get_paginator("list_queues").paginate():
        for url in page.get("QueueUrls", []):
            try:
                tags = cloud.call(sqs.list_queue_tags, QueueUrl=url).get("Tags", {})
            except errors.NotFoundError:
                continue
            yield url.rsplit("/", 1)[-1], tags


def _db_instances(cloud: Cloud) -> Iterator[tuple[str, dict[str, str]]]:
    for page in cloud.client("rds").get_paginator("describe_db_instances").paginate():
        for db in page.get("DBInstances", []):
            yield db["DBInstanceIdentifier"], _tags(db.get("TagList", []))


# How to list each kind's resources in the cloud: (name, tags) of every one, ours or not.
CLOUD_LISTINGS: dict[str, Callable[[Cloud], Iterator[tuple[str, dict[str, str]]]]] = {
    "DatabaseInstance": _db_instances,
    "S3Bucket": _buckets,
    "Queue": _queues,
}


def cloud_resources(
    cloud: Cloud, cluster_id: str | None = None, kinds: Iterable[str] | None = None
) -> list[CloudResource]:
    """The resources of `kinds` (default: all) in the cloud, with their tags.

    Only those tagged with `cluster_id` when it is given; a service the endpoint does not
    offer has nothing to list.
    """
    found: list[CloudResource] = []
    for kind in kinds or CLOUD_LISTINGS:
        try:
            for name, tags in CLOUD_LISTINGS[kind](cloud):
                if cluster_id is None or tags.get(CLUSTER_TAG) == cluster_id:
                    found.append(CloudResource(kind, name, tags))
        except Exception as exc:  # noqa: BLE001 - classified right here
            classified = classify(exc)
            if not isinstance(classified, errors.NotSupportedError):
                raise classified from None
    return found


def custom_resources(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for kind, plural in PLURALS.items():
        listing = kube.request("GET", f"/apis/{API_VERSION}/{plural}") or {}
        for item in listing.get("items", []):
            item.setdefault("kind", kind)
            items.append(item)
    return items


def find(aws: Cloud, kube: Kube, cluster_id: str) -> list[Finding]:
    cloud = cloud_resources(aws, cluster_id)
    crs = custom_resources(kube)
    uids = {cr["metadata"]["uid"] for cr in crs}
    findings = [
        Finding(
            "leaked",
            r.kind,
            r.name,
            f"owner {r.tags.get(NAMESPACE_TAG, '?')}/{r.tags.get(NAME_TAG, '?')} "
            f"(uid {r.owner_uid or 'none'}) no longer exists",
        )
        for r in cloud
        if r.owner_uid not in uids
    ]
    by_owner = {(r.kind, r.name, r.owner_uid) for r in cloud}
    for cr in crs:
        status = cr.get("status") or {}
        name = status.get("externalName")
        was_ready = bool(status.get("connectionSecret"))
        if not name or not was_ready or cr["metadata"].get("deletionTimestamp"):
            continue
        if (cr["kind"], name, cr["metadata"]["uid"]) not in by_owner:
            findings.append(
                Finding(
                    "vanished",
                    cr["kind"],
                    name,
                    f"{cr['metadata']['namespace']}/{cr['metadata']['name']} has no cloud resource",
                )
            )
    return findings


def report(findings: list[Finding]) -> str:
    if not findings:
        return "no leaks: every tagged cloud resource has its CR, every CR its cloud resource"
    rows = [("PROBLEM", "KIND", "NAME", "DETAIL")] + [
        (f.problem, f.kind, f.name, f.detail) for f in findings
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)
