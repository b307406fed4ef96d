"""Operator settings from flags, then the environment, then defaults."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line naming it."""


def _number(name: str, default: str, kind: type[int] | type[float] = int) -> Any:
    value = _env(name, default)
    try:
        return kind(value)
    except ValueError:
        hint = ""
        if value.startswith(("tcp://", "udp://")):
            # Kubernetes' Docker-link variables for a Service named like the setting.
            hint = " (a Service's link variable: set enableServiceLinks: false on the pod)"
        raise ConfigError(f"{name}={value!r} is not a number{hint}") from None


# An AWS region's name (the CRDs' pattern for spec.region), at most REGION_MAX_LENGTH long.
REGION_PATTERN = re.compile(r"[a-z]{2,4}(-[a-z]+){1,3}-[0-9]{1,2}")
REGION_MAX_LENGTH = 32


def region_list(value: str) -> tuple[str, ...]:
    """`ab-new-1,cd-new-2` -> the regions; ConfigError for one that is no region's name."""
    regions = tuple(r.strip() for r in value.split(",") if r.strip())
    for region in regions:
        if len(region) > REGION_MAX_LENGTH or not REGION_PATTERN.fullmatch(region):
            raise ConfigError(
                f"extra region {region!r} is not a region's name (e.g. eu-west-1, at most "
                f"{REGION_MAX_LENGTH} characters; --extra-regions or PROVISIONER_EXTRA_REGIONS)"
            )
    return regions


@dataclass(frozen=True)
class Settings:
    region: str = "us-east-1"
    # Regions spec.region may name besides those of botocore's endpoint table, `region` and
    # the CloudAccounts' (placement/accounts.py): AWS regions newer than the pinned botocore.
    extra_regions: tuple[str, ...] = ()
    endpoint_url: str | None = None
    cluster_id: str = "default"
    # Empty means every namespace (cluster-wide). kopf glob patterns are accepted.
    namespaces: list[str] = field(default_factory=list)
    resync_seconds: float = 300.0
    liveness_port: int = 8080
    metrics_port: int = 0
    log_format: str = "plain"
    peering: str | None = None
    # Peers of equal priority all pause (kopf), so each replica draws its own at start.
    peering_priority: int | None = None
    peering_lifetime: int = 60
    workers: int = 32
    # Passes one namespace may have in flight at once (None: a quarter of `workers`, at least
    # 1; 0: no cap): another namespace's resources always find a slot free.
    namespace_max_passes: int | None = None
    # Client-side AWS call budget: overrides of the documented limits, e.g. "rds=300:12,s3=off"
    # (provisioner/aws/budget.py), and how long throttling is absorbed before a call fails.
    aws_budget: str = ""
    aws_budget_max_throttled_seconds: float = 60.0
    # CloudAccounts: served (read, and resources placed in them) unless off; their status
    # and finalizer kept by this replica when `manage_accounts` (default: when cluster-wide,
    # so that of several namespaced operators none fights over a cluster-scoped object).
    accounts: bool = True
    manage_accounts: bool | None = None
    # spec.access: off, irsa or pod-identity (provisioner/access/iam.py), and what each needs.
    access: str = "off"
    # spec.ttl / spec.expiresAt: the Warning Event and condition Expiring come this long before
    # the deletion (or half the lifetime, when that is shorter).
    expiry_warning_seconds: float = 3600.0
    oidc_issuer: str = ""
    eks_cluster: str = ""
    # The conversion webhook (provisioner/webhook/server.py): served by this process unless off
    # (then another process serves it: `provisioner webhook`).
    webhook: bool = True
    webhook_port: int = 9443
    # In a cluster: the Service (namespace/name) and its port the CRDs point at; outside
    # one, https://127.0.0.1:<webhook_port>/convert unless webhook_url says otherwise.
    webhook_service: str = ""
    webhook_service_port: int = 9443
    webhook_url: str = ""
    webhook_secret: str = "provisioner-webhook-tls"  # noqa: S105 - a Secret's name
    # The operator's own namespace (the webhook's Secret lives there); "" : the
    # ServiceAccount's namespace in a cluster, else "default".
    namespace: str = ""
    # Sharding (provisioner/runtime/sharding.py): replicas split the resources between them. The
    # shard's name is this replica's (the pod's name); its Lease lives in `namespace`.
    sharding: bool = False
    shard_name: str = ""
    shard_lease_seconds: int = 15
    shard_ring: str = "provisioner"
    # Whether the cloud.provisioner.dev/requested-by annotation can be trusted: "verified"
    # where an admission policy lets only the creating user set it (the chart's), so Events
    # and logs name the requester; "unverified" (the default): they name nobody.
    requested_by: str = "unverified"

    @property
    def requester_verified(self) -> bool:
        return self.requested_by == VERIFIED

    @property
    def passes_per_namespace(self) -> int:
        """The cap of one namespace's passes in flight (0: none)."""
        if self.namespace_max_passes is None:
            return max(1, self.workers // 4)
        return max(0, self.namespace_max_passes)

    @property
    def manages_accounts(self) -> bool:
        if not self.accounts:
            return False
        return not self.namespaces if self.manage_accounts is None else self.manage_accounts

    @classmethod
    def from_env(cls) -> Settings:
        namespaces = [n.strip() for n in _env("PROVISIONER_NAMESPACES").split(",") if n.strip()]
        return cls(
            region=_env("PROVISIONER_REGION")
            or _env("AWS_REGION")
            or _env("AWS_DEFAULT_REGION")
            or "us-east-1",
            extra_regions=region_list(_env("PROVISIONER_EXTRA_REGIONS")),
            endpoint_url=_env("PROVISIONER_AWS_ENDPOINT_URL") or _env("AWS_ENDPOINT_URL") or None,
            cluster_id=_env("PROVISIONER_CLUSTER_ID", "default"),
            namespaces=namespaces,
            resync_seconds=_number("PROVISIONER_RESYNC_SECONDS", "300", float),
            liveness_port=_number("PROVISIONER_LIVENESS_PORT", "8080"),
            metrics_port=_number("PROVISIONER_METRICS_PORT", "0"),
            log_format=_env("PROVISIONER_LOG_FORMAT", "plain"),
            peering=_env("PROVISIONER_PEERING") or None,
            peering_priority=_number("PROVISIONER_PEERING_PRIORITY", "")
            if _env("PROVISIONER_PEERING_PRIORITY")
            else None,
            peering_lifetime=_number("PROVISIONER_PEERING_LIFETIME", "60"),
            workers=_number("PROVISIONER_WORKERS", "32"),
            namespace_max_passes=_number("PROVISIONER_NAMESPACE_MAX_PASSES", "")
            if _env("PROVISIONER_NAMESPACE_MAX_PASSES")
            else None,
            aws_budget=_env("PROVISIONER_AWS_BUDGET"),
            aws_budget_max_throttled_seconds=_number(
                "PROVISIONER_AWS_BUDGET_MAX_THROTTLED_SECONDS", "60", float
            ),
            accounts=_env("PROVISIONER_ACCOUNTS", "on").lower() not in ("off", "false", "0"),
            manage_accounts=_switch(_env("PROVISIONER_MANAGE_ACCOUNTS")),
            access=_env("PROVISIONER_ACCESS", "off").lower() or "off",
            expiry_warning_seconds=_number("PROVISIONER_EXPIRY_WARNING_SECONDS", "3600", float),
            oidc_issuer=_env("PROVISIONER_OIDC_ISSUER"),
            eks_cluster=_env("PROVISIONER_EKS_CLUSTER"),
            webhook=_switch(_env("PROVISIONER_WEBHOOK")) is not False,
            webhook_port=_number("PROVISIONER_WEBHOOK_PORT", "9443"),
            webhook_service=_env("PROVISIONER_WEBHOOK_SERVICE"),
            webhook_service_port=_number("PROVISIONER_WEBHOOK_SERVICE_PORT", "9443"),
            webhook_url=_env("PROVISIONER_WEBHOOK_URL"),
            webhook_secret=_env("PROVISIONER_WEBHOOK_SECRET", "provisioner-webhook-tls"),
            namespace=_env("PROVISIONER_NAMESPACE"),
            sharding=_switch(_env("PROVISIONER_SHARDING")) is True,
            shard_name=_env("PROVISIONER_SHARD_NAME") or _env("POD_NAME") or _env("HOSTNAME"),
            shard_lease_seconds=_number("PROVISIONER_SHARD_LEASE_SECONDS", "15"),
            shard_ring=_env("PROVISIONER_SHARD_RING", "provisioner"),
            requested_by=_requested_by(_env("PROVISIONER_REQUESTED_BY") or UNVERIFIED),
        )


VERIFIED, UNVERIFIED = "verified", "unverified"


def _requested_by(value: str) -> str:
    if value.lower() not in (VERIFIED, UNVERIFIED):
        raise ConfigError(
            f"PROVISIONER_REQUESTED_BY={value!r}: {VERIFIED} (an admission policy lets only "
            f"the creating user set cloud.provisioner.dev/requested-by) or {UNVERIFIED}"
        )
    return value.lower()


def _switch(value: str) -> bool | None:
    if not value:
        return None
    return value.lower() in ("on", "true", "1", "yes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _cloud_arguments(parser)
    _watch_arguments(parser)
    _capacity_arguments(parser)
    _account_arguments(parser)
    _webhook_and_sharding_arguments(parser)
    _identity_arguments(parser)


def _cloud_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the cloud resources live and how they are named."""
    parser.add_argument("--region", help="AWS region (env PROVISIONER_REGION or AWS_REGION)")
    parser.add_argument(
        "--extra-regions",
        help="regions spec.region may name that botocore does not know yet, comma-separated "
        "(env PROVISIONER_EXTRA_REGIONS)",
    )
    parser.add_argument(
        "--endpoint-url", help="AWS endpoint, e.g. moto or LocalStack (env AWS_ENDPOINT_URL)"
    )
    parser.add_argument(
        "--cluster-id", help="put on every cloud resource as provisioner.dev/cluster"
    )


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    """What this replica watches, what it serves, and its peers."""
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="watch only this namespace (repeatable; globs allowed); default: all",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        help="periodic re-check of every resource (default 300; 0 turns it off)",
    )
    parser.add_argument("--liveness-port", type=int, help="port of /healthz (default 8080)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0: off)")
    parser.add_argument("--log-format", choices=["plain", "json"], help="log line format")
    parser.add_argument("--peering", help="kopf peering object name, for several replicas")
    parser.add_argument(
        "--peering-priority", type=int, help="this replica's priority (default: random)"
    )
    parser.add_argument(
        "--peering-lifetime", type=int, help="seconds before a silent peer counts as dead (60)"
    )


def _capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """How much runs at once: passes, and calls to AWS."""
    parser.add_argument("--workers", type=int, help="resources reconciled at once (default 32)")
    parser.add_argument(
        "--namespace-max-passes",
        type=int,
        help="resources of one namespace reconciled at once (default: a quarter of --workers, "
        "at least 1; 0: no cap)",
    )
    parser.add_argument(
        "--aws-budget",
        help="AWS call budget overrides, NAME=BURST:RATE or NAME=off, comma-separated "
        "(names: rds, sqs, sqs.tagging, s3; default: AWS's documented limits)",
    )
    parser.add_argument(
        "--aws-budget-max-throttled-seconds",
        type=float,
        help="how long throttling is absorbed before a call fails (default 60)",
    )


def _account_arguments(parser: argparse.ArgumentParser) -> None:
    """CloudAccounts, expiry, and access grants."""
    parser.add_argument(
        "--accounts",
        choices=["on", "off"],
        help="serve CloudAccounts (default on; needs read access to cloudaccounts and namespaces)",
    )
    parser.add_argument(
        "--manage-accounts",
        choices=["on", "off"],
        help="keep CloudAccounts' and ResourceClasses' status and finalizer (default: on when "
        "cluster-wide)",
    )
    parser.add_argument(
        "--expiry-warning-seconds",
        type=float,
        help="how long before a spec.ttl/expiresAt deletion the Expiring Event comes (3600; "
        "at most half the lifetime)",
    )
    parser.add_argument(
        "--access",
        choices=["off", "irsa", "pod-identity"],
        help="grant spec.access through IAM roles for ServiceAccounts (irsa) or EKS Pod "
        "Identity (default off; irsa needs get/patch on serviceaccounts)",
    )
    parser.add_argument(
        "--oidc-issuer",
        help="with --access=irsa: the cluster's OIDC issuer URL (env PROVISIONER_OIDC_ISSUER)",
    )


def _webhook_and_sharding_arguments(parser: argparse.ArgumentParser) -> None:
    """The conversion webhook, and sharding."""
    parser.add_argument(
        "--webhook",
        choices=["on", "off"],
        help="serve the conversion webhook in this process (default on; off: another "
        "process runs `provisioner webhook`)",
    )
    parser.add_argument(
        "--webhook-port", type=int, help="the conversion webhook's HTTPS port (default 9443)"
    )
    parser.add_argument(
        "--sharding",
        choices=["on", "off"],
        help="split the resources between the replicas that run with it on (default off; "
        "excludes --peering)",
    )
    parser.add_argument(
        "--shard-name", help="this replica's shard name (default: env POD_NAME, else the host's)"
    )
    parser.add_argument(
        "--shard-lease-seconds",
        type=int,
        help="seconds after which a silent replica's resources move to the others (default 15)",
    )


def _identity_arguments(parser: argparse.ArgumentParser) -> None:
    """The EKS cluster of Pod Identity, and whom Events name."""
    parser.add_argument(
        "--eks-cluster",
        help="with --access=pod-identity: the EKS cluster's name (env PROVISIONER_EKS_CLUSTER)",
    )
    parser.add_argument(
        "--requested-by",
        choices=[VERIFIED, UNVERIFIED],
        help="verified: an admission policy lets only the creating user set the "
        "cloud.provisioner.dev/requested-by annotation (the chart's), and Events and logs name "
        "the requester; unverified (default): they name nobody (env PROVISIONER_REQUESTED_BY)",
    )


def from_args(args: argparse.Namespace) -> Settings:
    base = Settings.from_env()
    overrides = {
        key: value
        for key, value in {
            "region": args.region,
            "extra_regions": None
            if getattr(args, "extra_regions", None) is None
            else region_list(args.extra_regions),
            "endpoint_url": args.endpoint_url,
            "cluster_id": args.cluster_id,
            "namespaces": args.namespaces,
            "resync_seconds": args.resync_seconds,
            "liveness_port": args.liveness_port,
            "metrics_port": args.metrics_port,
            "log_format": args.log_format,
            "peering": args.peering,
            "peering_priority": args.peering_priority,
            "peering_lifetime": args.peering_lifetime,
            "workers": args.workers,
            "namespace_max_passes": getattr(args, "namespace_max_passes", None),
            "aws_budget": args.aws_budget,
            "aws_budget_max_throttled_seconds": args.aws_budget_max_throttled_seconds,
            "accounts": None if args.accounts is None else args.accounts == "on",
            "manage_accounts": _switch(args.manage_accounts or ""),
            "access": args.access,
            "expiry_warning_seconds": args.expiry_warning_seconds,
            "oidc_issuer": args.oidc_issuer,
            "eks_cluster": args.eks_cluster,
            "webhook": None if getattr(args, "webhook", None) is None else args.webhook == "on",
            "webhook_port": getattr(args, "webhook_port", None),
            "sharding": None if getattr(args, "sharding", None) is None else args.sharding == "on",
            "shard_name": getattr(args, "shard_name", None),
            "shard_lease_seconds": getattr(args, "shard_lease_seconds", None),
            "requested_by": getattr(args, "requested_by", None),
        }.items()
        if value is not None
    }
    settings = Settings(**{**base.__dict__, **overrides})
    check_sharding(settings)
    return settings


def check_sharding(settings: Settings) -> None:
    """Sharding's settings make sense together, or one line says which does not."""
    if not settings.sharding:
        return
    if settings.peering:
        raise ConfigError(
            "--sharding=on and --peering exclude each other: sharded replicas are all active"
        )
    if any(ch in pattern for pattern in settings.namespaces for ch in "*?!,"):
        raise ConfigError("--sharding=on needs exact --namespace names, not patterns")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", settings.shard_name):
        raise ConfigError(
            f"shard name {settings.shard_name!r} must be 1-63 lower-case letters, digits, '-' "
            "or '.', starting and ending with a letter or digit (--shard-name or env POD_NAME)"
        )
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", settings.shard_ring):
        raise ConfigError(
            f"shard ring {settings.shard_ring!r} must be 1-63 lower-case letters, digits or '-', "
            "starting and ending with a letter or digit (PROVISIONER_SHARD_RING)"
        )
    if settings.shard_lease_seconds < 3:
        raise ConfigError(
            f"--shard-lease-seconds={settings.shard_lease_seconds}: at least 3 seconds"
        )
