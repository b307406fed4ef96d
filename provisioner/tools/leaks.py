"""`provisioner leaks`: what the cloud and the cluster disagree about.

- leaked: a cloud resource tagged with our cluster id whose owner CR does not exist;
- vanished: a CR that says its resource exists (status.externalName and Ready once)
  while the cloud has nothing of that name and owner.
Resources retained on purpose (deletionPolicy Retain) are leaks by this definition too:
their CR is gone. They are listed with their tags so a platform engineer can decide.

It looks in the operator's own account and in every CloudAccount (through its role), in each
region in use there: the CloudAccount's `regions` when it lists them, else its default region,
the operator's, and every region a resource of it names or lives in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from provisioner import ACCOUNTS_API_VERSION
from provisioner.access import iam
from provisioner.aws import errors
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws, classify
from provisioner.kinds.contract import OwnedResource
from provisioner.kinds.registry import BY_KIND, KINDS
from provisioner.kube.client import Kube
from provisioner.kube.inventory import custom_resources
from provisioner.model.account import AccountRef
from provisioner.model.resource import NAME_TAG, NAMESPACE_TAG
from provisioner.placement import accounts

T = TypeVar("T")


@dataclass(frozen=True)
class Finding:
    problem: str  # leaked | vanished
    kind: str
    name: str
    detail: str


class Cloud(Protocol):
    """What the listing needs: `Aws`, or any other source of boto3 clients (the dev tools')."""

    codes: ErrorCodes

    def client(self, service: str, region: str | None = None) -> Any: ...

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...


def cloud_resources(
    cloud: Cloud,
    cluster_id: str | None = None,
    kinds: Iterable[str] | None = None,
    regions: Iterable[str] = ("",),
) -> list[OwnedResource]:
    """The resources of `kinds` (default: every kind) in each of `regions` ("" is the
    client's default region), with their tags; only those tagged with `cluster_id` when given.

    A service the endpoint does not offer has nothing to list.
    """
    wanted = [BY_KIND[k] for k in kinds] if kinds is not None else list(KINDS)
    found: list[OwnedResource] = []
    for region in regions:
        for kind in wanted:
            try:
                listed = list(kind.list_resources(cloud, region))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - classified right here
                classified = classify(exc, cloud.codes)
                if not isinstance(classified, errors.NotSupportedError):
                    raise classified from None
                continue
            found.extend(r for r in listed if cluster_id is None or r.cluster == cluster_id)
    return found


class InAccount:
    """`Aws` acting in one CloudAccount: what `cloud_resources` needs."""

    def __init__(self, aws: Aws, account: AccountRef) -> None:
        self.aws, self.account, self.codes = aws, account, aws.codes

    def client(self, service: str, region: str | None = None) -> Any:
        return self.aws.client(service, region, self.account)

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return self.aws.call(fn, *args, **kwargs)


def _regions_of(crs: list[dict[str, Any]], account: str) -> set[str]:
    """The regions the resources that live in (or name) CloudAccount `account` use."""
    found: set[str] = set()
    for cr in crs:
        status, spec = cr.get("status") or {}, cr.get("spec") or {}
        if str(status.get("account", spec.get("account") or "")) != account:
            continue
        found |= {str(r) for r in (spec.get("region"), status.get("region")) if r}
    # Only regions AWS has: a spec may name any (refused by the operator), and a client is
    # made for every region listed here.
    return {r for r in found if r in accounts.botocore_regions()}


def find(aws: Cloud, kube: Kube, cluster_id: str, region: str) -> list[Finding]:
    crs = custom_resources(kube)
    # The operator's own account: its region and every region a CR of it uses.
    places: list[tuple[str, Cloud, list[str]]] = [
        ("", aws, sorted({region} | _regions_of(crs, "")))
    ]
    if isinstance(aws, Aws):
        listing = kube.request("GET", f"/apis/{ACCOUNTS_API_VERSION}/{accounts.PLURAL}") or {}
        for item in listing.get("items", []):
            account = accounts.CloudAccount.from_body(item)
            used = set(account.regions) or (
                {account.default_region or region} | _regions_of(crs, account.name)
            )
            places.append((account.account_id, InAccount(aws, account.ref), sorted(used)))
    cloud: list[tuple[str, OwnedResource]] = []
    for account_id, where, in_regions in places:
        cloud += [(account_id, r) for r in cloud_resources(where, cluster_id, regions=in_regions)]
    uids = {cr["metadata"]["uid"] for cr in crs}
    findings = [
        Finding(
            "leaked",
            r.kind,
            r.name,
            f"owner {r.tags.get(NAMESPACE_TAG, '?')}/{r.tags.get(NAME_TAG, '?')} "
            f"(uid {r.owner_uid or 'none'}) no longer exists"
            + (f"; in account {account_id}" if account_id else ""),
        )
        for account_id, r in cloud
        if r.owner_uid not in uids
    ]
    findings += _leaked_roles(places, crs, cluster_id)
    by_owner = {(r.kind, r.name, r.owner_uid) for _, r in cloud}
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


def _leaked_roles(
    places: list[tuple[str, Cloud, list[str]]], crs: list[dict[str, Any]], cluster_id: str
) -> list[Finding]:
    """spec.access's IAM roles (in each account) that no resource grants any more, and their
    policies whose resource is gone."""
    granted: set[tuple[str, str]] = set()
    policies: set[str] = set()
    for cr in crs:
        meta, spec, status = cr["metadata"], cr.get("spec") or {}, cr.get("status") or {}
        entries = [*(spec.get("access") or []), *(status.get("access") or [])]
        granted |= {(meta["namespace"], str(e.get("serviceAccountName"))) for e in entries}
        if entries:
            policies.add(iam.policy_name(cr["kind"], meta["name"], meta["uid"]))
    findings = []
    seen: set[str] = set()
    for account_id, where, _ in places:
        if account_id in seen:
            continue  # IAM is global: one listing per account, however many CloudAccounts
        seen.add(account_id)
        try:
            roles = list(iam.list_roles(where, cluster_id))
        except errors.NotSupportedError:
            continue
        suffix = f"; in account {account_id}" if account_id else ""
        for role in roles:
            ns = role.tags.get(NAMESPACE_TAG, "?")
            sa = role.tags.get(iam.SERVICE_ACCOUNT_TAG, "?")
            if (ns, sa) not in granted:
                findings.append(
                    Finding(
                        "leaked",
                        "IAMRole",
                        role.name,
                        f"no resource grants ServiceAccount {ns}/{sa} any more{suffix}",
                    )
                )
                continue
            findings += [
                Finding(
                    "leaked",
                    "IAMRolePolicy",
                    f"{role.name}/{policy}",
                    f"the granting resource no longer exists{suffix}",
                )
                for policy in role.policies
                if policy not in policies
            ]
    return findings


def report(findings: list[Finding]) -> str:
    if not findings:
        return "no leaks: every tagged cloud resource has its CR, every CR its cloud resource"
    rows = [("PROBLEM", "KIND", "NAME", "DETAIL")] + [
        (f.problem, f.kind, f.name, f.detail) for f in findings
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)


def write_metrics(findings: list[Finding], path: str) -> None:
    """The findings as Prometheus metrics in the text format, written to `path` atomically:
    for node_exporter's textfile collector, or `curl --data-binary @path` to a Pushgateway.

    provisioner_leaks{problem,kind}: findings by problem (leaked, vanished) and kind, every
    kind of the operator's present (0 when clean); provisioner_leaks_last_run_timestamp_seconds.
    """
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    gauge = Gauge(
        "provisioner_leaks",
        "Findings of `provisioner leaks`: cloud resources without their CR (leaked) and CRs "
        "whose cloud resource is gone (vanished), by kind",
        ["problem", "kind"],
        registry=registry,
    )
    for problem in ("leaked", "vanished"):
        for kind in KINDS:
            gauge.labels(problem, kind.kind)
    for finding in findings:
        gauge.labels(finding.problem, finding.kind).inc()
    Gauge(
        "provisioner_leaks_last_run_timestamp_seconds",
        "When `provisioner leaks` last finished a listing",
        registry=registry,
    ).set_to_current_time()
    write_to_textfile(path, registry)
