"""`provisioner leaks`: what the cloud and the cluster disagree about.

- leaked: a cloud resource tagged with our cluster id whose owner CR does not exist;
- vanished: a CR that says its resource exists (status.externalName and Ready once)
  while the cloud has nothing of that name and owner.
Resources retained on purpose (deletionPolicy Retain) are leaks by this definition too:
their CR is gone. They are listed with their tags so a platform engineer can decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from provisioner import API_VERSION
from provisioner.cloud import errors
from provisioner.cloud.aws import Aws, classify
from provisioner.cloud.base import OwnedResource
from provisioner.kinds import KINDS, PLURALS
from provisioner.kube import Kube
from provisioner.models import CLUSTER_TAG, NAME_TAG, NAMESPACE_TAG


@dataclass(frozen=True)
class Finding:
    problem: str  # leaked | vanished
    kind: str
    name: str
    detail: str


def cloud_resources(aws: Aws, cluster_id: str, regions: list[str]) -> list[OwnedResource]:
    """Every resource of every kind, in each region, tagged with our cluster id."""
    found: list[OwnedResource] = []
    for region in regions:
        for kind in KINDS:
            try:
                found.extend(kind.list_resources(aws, region))
            except Exception as exc:  # noqa: BLE001 - an endpoint without the service has none
                classified = classify(exc, aws.codes)
                if not isinstance(classified, errors.NotSupportedError):
                    raise classified from None
    return [r for r in found if r.tags.get(CLUSTER_TAG) == cluster_id]


def custom_resources(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for kind, plural in PLURALS.items():
        listing = kube.request("GET", f"/apis/{API_VERSION}/{plural}") or {}
        for item in listing.get("items", []):
            item.setdefault("kind", kind)
            items.append(item)
    return items


def find(aws: Aws, kube: Kube, cluster_id: str, region: str) -> list[Finding]:
    crs = custom_resources(kube)
    # The operator's region and every region a CR names.
    regions = sorted(
        {region} | {str(cr["spec"]["region"]) for cr in crs if cr.get("spec", {}).get("region")}
    )
    cloud = cloud_resources(aws, cluster_id, regions)
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
