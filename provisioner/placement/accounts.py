"""CloudAccounts: which AWS account a resource lives in, and who may use which.

A `CloudAccount` (cluster-scoped, created by platform admins) names an account, the role
the operator assumes in it, the regions it may be used in and the namespaces that may use
it. A resource's account is, in this order:

1. the one its status records (`status.account`, written before its first create call):
   a cloud resource never moves between accounts, whatever changes later;
2. `spec.account`;
3. its namespace's `cloud.provisioner.dev/default-account` annotation;
4. none: the operator's own credentials, as without CloudAccounts at all.

Refusals happen before any cloud call, in any account: `AccountNotFound`,
`AccountNotAllowed` (the namespace is not selected), `RegionNotAllowed`. A resource being
deleted that already lives in an account may still clean up there, selected or not.

A `spec.region` must be a region the operator knows (`Directory.check_region`), checked
before anything else, with CloudAccounts served or not: one of botocore's endpoint table
(every partition's regions), the operator's own `--region`, its `--extra-regions` (regions
newer than the pinned botocore) or one a CloudAccount lists. Anything else is `InvalidSpec`
before any cloud call, so that no client, call budget bucket or metric label is ever made
for it: those exist per known region and account only.

The directory is fed by watches of CloudAccounts and Namespaces; a name it has not seen is
read from the API server once (a resource may be resumed before the watch lists it).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from provisioner.aws import botodata
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.account import AccountRef

if TYPE_CHECKING:
    from provisioner.config import Settings

PLURAL = "cloudaccounts"
KIND = "CloudAccount"
# A name the API server does not know is asked again after this long at most.
MISS_TTL = 5.0


@functools.cache
def botocore_regions() -> frozenset[str]:
    """Every region of every partition in botocore's endpoint table (the pruned copy the
    operator ships, provisioner/aws/botodata.py)."""
    table = botodata.Loader().load_data("endpoints")
    return frozenset(str(r) for p in table["partitions"] for r in p.get("regions") or {})


def pinned(status: Mapping[str, Any]) -> bool:
    """Whether the resource already lives somewhere: its account is recorded, or it was
    created before CloudAccounts existed (then in the operator's own account)."""
    return "account" in status or bool(status.get("externalName"))


class AccountRefused(Exception):
    """The resource may not act in the account it names (no cloud call was made)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class CloudAccount:
    name: str
    account_id: str
    role_arn: str
    external_id: str = ""
    regions: tuple[str, ...] = ()
    default_region: str = ""
    selector: Mapping[str, Any] = field(default_factory=dict)
    generation: int = 0
    deleting: bool = False
    # Tags of every resource in the account, under its class's and its own.
    tags: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> CloudAccount:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        return cls(
            name=str(meta.get("name", "")),
            account_id=str(spec.get("accountId", "")),
            role_arn=str(spec.get("roleArn", "")),
            external_id=str(spec.get("externalId") or ""),
            regions=tuple(str(r) for r in spec.get("regions") or ()),
            default_region=str(spec.get("defaultRegion") or ""),
            selector=dict(spec.get("namespaceSelector") or {}),
            generation=int(meta.get("generation") or 0),
            deleting=bool(meta.get("deletionTimestamp")),
            tags={str(k): str(v) for k, v in (spec.get("tags") or {}).items()},
        )

    @property
    def ref(self) -> AccountRef:
        return AccountRef(self.name, self.account_id, self.role_arn, self.external_id)

    def selects(self, labels: Mapping[str, str]) -> bool:
        """A standard label selector over the namespace's labels; an empty one selects none."""
        return selector_matches(self.selector, labels)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


@dataclass(frozen=True)
class NamespaceInfo:
    labels: Mapping[str, str]
    default_account: str


@dataclass(frozen=True)
class Placement:
    """Where a resource acts: its account (None: the operator's own) and its region."""

    account: CloudAccount | None
    region: str


class Directory:
    """What the operator knows of CloudAccounts and namespaces; thread-safe."""

    def __init__(
        self,
        load_account: Callable[[str], Mapping[str, Any] | None],
        load_namespace: Callable[[str], Mapping[str, Any] | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load_account = load_account
        self._load_namespace = load_namespace
        self.clock = clock
        self._lock = threading.Lock()
        self.accounts: dict[str, CloudAccount] = {}
        self.namespaces: dict[str, NamespaceInfo] = {}
        self._misses: dict[str, float] = {}

    # -- fed by the watches ----------------------------------------------------------

    def account_seen(self, body: Mapping[str, Any]) -> tuple[CloudAccount | None, CloudAccount]:
        """Record a CloudAccount; returns (what was known before, what is known now)."""
        account = CloudAccount.from_body(body)
        with self._lock:
            before = self.accounts.get(account.name)
            self.accounts[account.name] = account
            self._misses.pop(account.name, None)
        return before, account

    def account_gone(self, name: str) -> CloudAccount | None:
        with self._lock:
            return self.accounts.pop(name, None)

    def namespace_seen(self, body: Mapping[str, Any]) -> tuple[NamespaceInfo | None, NamespaceInfo]:
        meta = body.get("metadata") or {}
        info = NamespaceInfo(
            labels=dict(meta.get("labels") or {}),
            default_account=str(
                (meta.get("annotations") or {}).get(annotation_keys.DEFAULT_ACCOUNT, "")
            ).strip(),
        )
        with self._lock:
            before = self.namespaces.get(str(meta.get("name", "")))
            self.namespaces[str(meta.get("name", ""))] = info
        return before, info

    def namespace_gone(self, name: str) -> None:
        with self._lock:
            self.namespaces.pop(name, None)

    # -- read by the reconciler (blocking: runs on the cloud thread pool) -------------

    def lists_region(self, region: str) -> bool:
        """Whether a known CloudAccount allows `region` or makes it its default."""
        with self._lock:
            return any(
                region in a.regions or region == a.default_region for a in self.accounts.values()
            )

    @staticmethod
    def check_region(
        directory: Directory | None,
        spec_region: str,
        status: Mapping[str, Any],
        settings: Settings,
        deleting: bool = False,
    ) -> None:
        """AccountRefused (InvalidSpec) for a spec.region the operator does not know (the
        module's docstring); `directory` None: no CloudAccounts served. Being deleted, a
        resource may still act in the region its status records it lives in."""
        region = spec_region
        if (
            not region
            or region in botocore_regions()
            or region == settings.region
            or region in settings.extra_regions
            or (directory is not None and directory.lists_region(region))
            or (deleting and region == status.get("region"))
        ):
            return
        raise AccountRefused(
            cond.INVALID_SPEC,
            f"spec.region {region}: not an AWS region this operator knows (those of its "
            "botocore, its own, its --extra-regions and the CloudAccounts'); no cloud call "
            "was made",
        )

    def in_use(self) -> bool:
        """Whether any CloudAccount is known (then where a resource lives must be pinned)."""
        with self._lock:
            return bool(self.accounts)

    def account(self, name: str) -> CloudAccount | None:
        with self._lock:
            known = self.accounts.get(name)
            missed = self._misses.get(name, 0.0) > self.clock()
        if known is not None or missed:
            return known
        body = self._load_account(name)
        if body is None:
            with self._lock:
                self._misses[name] = self.clock() + MISS_TTL
            return None
        return self.account_seen(body)[1]

    def namespace(self, name: str) -> NamespaceInfo:
        with self._lock:
            known = self.namespaces.get(name)
        if known is not None:
            return known
        body = self._load_namespace(name)
        if body is None:
            return NamespaceInfo({}, "")
        return self.namespace_seen(body)[1]

    def place(
        self,
        namespace: str,
        spec_account: str,
        spec_region: str,
        status: Mapping[str, Any],
        default_region: str,
        deleting: bool = False,
    ) -> Placement:
        """The account and region a resource acts in, or AccountRefused."""
        lives = pinned(status)
        if lives:
            name = str(status.get("account") or "")
            if spec_account and spec_account != name:
                where = f"CloudAccount {name}" if name else "the operator's own account"
                raise AccountRefused(
                    cond.INVALID_SPEC,
                    f"spec.account {spec_account}: this resource already lives in {where}; "
                    "a cloud resource cannot move between accounts",
                )
        else:
            name = spec_account or self.namespace(namespace).default_account
        region = spec_region
        pinned_region = str(status.get("region") or "")
        if lives and pinned_region and region and region != pinned_region:
            if deleting:
                region = pinned_region  # deleted where it lives, whatever the spec says now
            else:
                raise AccountRefused(
                    cond.INVALID_SPEC,
                    f"spec.region {region}: this resource already lives in {pinned_region}; "
                    "a cloud resource cannot move between regions",
                )
        if not name:
            return Placement(None, region or pinned_region or default_region)
        account = self.account(name)
        if account is None:
            raise AccountRefused(cond.ACCOUNT_NOT_FOUND, f"CloudAccount {name} does not exist")
        if not deleting or not lives:
            if account.deleting and not lives:
                raise AccountRefused(
                    cond.ACCOUNT_NOT_FOUND,
                    f"CloudAccount {name} is being deleted: no new resources in it",
                )
            if not account.selects(self.namespace(namespace).labels):
                raise AccountRefused(
                    cond.ACCOUNT_NOT_ALLOWED,
                    f"CloudAccount {name} does not select namespace {namespace} "
                    "(its spec.namespaceSelector)",
                )
        region = region or pinned_region or account.default_region or default_region
        if account.regions and region not in account.regions and not (deleting and lives):
            raise AccountRefused(
                cond.REGION_NOT_ALLOWED,
                f"region {region} is not allowed in CloudAccount {name} "
                f"(allowed: {', '.join(account.regions)})",
            )
        return Placement(account, region)
