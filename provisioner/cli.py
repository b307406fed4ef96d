"""Command line: `provisioner run`, `provisioner leaks`, and `provisioner dev ...`.

The `dev` commands (a local control plane, moto and the operator) live in the separate
`provisioner_dev` package, which is never part of the operator's image: they are looked up
by name and offered only where that package is installed (a checkout with the dev extra).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from provisioner import config

if TYPE_CHECKING:
    from provisioner.cloud.aws import AwsSettings


def _fail(message: str) -> int:
    print(f"provisioner: {message}", file=sys.stderr)
    return 1


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's per-thread malloc arenas before any thread starts.

    Cloud calls run in a thread pool; with the default (8 per core) each thread's
    allocations fragment an arena of its own, and resident memory grows for nothing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def _aws_settings(settings: config.Settings) -> AwsSettings:
    """The cloud settings, or BudgetSpecError for a budget that does not parse."""
    from provisioner.cloud.aws import AwsSettings
    from provisioner.cloud.budget import BudgetSettings

    budget = BudgetSettings.from_spec(
        settings.aws_budget, settings.aws_budget_max_throttled_seconds
    )
    return AwsSettings(
        region=settings.region,
        endpoint_url=settings.endpoint_url,
        budget=budget,
        session_name=f"provisioner-{settings.cluster_id}"[:64],
    )


def cmd_run(args: argparse.Namespace) -> int:
    _limit_malloc_arenas()
    # kopf looks for the official Kubernetes client when it is imported and, where one is
    # installed (a development virtualenv), loads all of it (~20 MB) to offer logins this
    # operator never uses: it logs in itself (provisioner.kubelogin). The image has none.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    import kopf

    from provisioner.access import Access
    from provisioner.cloud.budget import BudgetSpecError
    from provisioner.cloud.iam import AccessSettings
    from provisioner.kinds import make_aws, make_clients
    from provisioner.kube import Kube
    from provisioner.operator import account_directory, event_poster, register
    from provisioner.reconcile import Reconciler

    settings = config.from_args(args)
    try:
        aws_settings = _aws_settings(settings)
    except BudgetSpecError as exc:
        return _fail(str(exc))
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
        log_prefix=settings.log_format != "json",
        log_refkey="object" if settings.log_format == "json" else None,
    )
    for noisy in ("botocore", "boto3", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    access_settings = AccessSettings(settings.access, settings.oidc_issuer, settings.eks_cluster)
    if problem := access_settings.problem():
        return _fail(problem)
    aws = make_aws(aws_settings)
    kube = Kube(pool_size=settings.workers + 4)
    events = ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")
    reconciler = Reconciler(
        settings,
        kube,
        make_clients(aws),
        event_poster(kube, events),
        directory=account_directory(kube) if settings.accounts else None,
        own_account=aws.account_id,
    )
    reconciler.access = Access(
        access_settings, settings.cluster_id, aws, kube, reconciler.in_thread
    )
    if settings.metrics_port:
        from provisioner import metrics

        aws.sessions.listeners.append(
            lambda account, outcome: metrics.ASSUME_ROLE.labels(account, outcome).inc()
        )
        metrics.serve(settings.metrics_port)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, settings, aws)
    logging.getLogger("provisioner").info(
        "starting: region=%s endpoint=%s cluster-id=%s namespaces=%s resync=%ss",
        settings.region,
        settings.endpoint_url or "aws",
        settings.cluster_id,
        ",".join(settings.namespaces) or "all",
        settings.resync_seconds,
    )
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=settings.peering is None,
            peering_name=settings.peering,
            liveness_endpoint=f"http://0.0.0.0:{settings.liveness_port}/healthz",
        )
    )
    return 0


def cmd_leaks(args: argparse.Namespace) -> int:
    from provisioner import leaks
    from provisioner.cloud.budget import BudgetSpecError
    from provisioner.cloud.errors import CloudError
    from provisioner.kinds import make_aws
    from provisioner.kube import Kube, KubeError

    settings = config.from_args(args)
    try:
        findings = leaks.find(
            make_aws(_aws_settings(settings)),
            Kube(pool_size=4),
            settings.cluster_id,
            settings.region,
        )
    except BudgetSpecError as exc:
        return _fail(str(exc))
    except (CloudError, KubeError) as exc:
        return _fail(f"cannot list resources: {exc}")
    print(leaks.report(findings))
    return 1 if findings else 0


DEV_HARNESS = "provisioner_dev.cli"


def _add_dev_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        harness = importlib.import_module(DEV_HARNESS)
    except ModuleNotFoundError:
        dev = sub.add_parser("dev", help="the local dev harness (not installed here)")
        dev.set_defaults(
            func=lambda _args: _fail(
                "the dev harness is not installed: run `make up` from a checkout of the project"
            )
        )
        return
    harness.add_commands(sub)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="provisioner", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the current kubeconfig")
    config.add_arguments(run)
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=cmd_run)

    leaks = sub.add_parser(
        "leaks",
        help="list cloud resources with our cluster id and no CR, and CRs whose resource vanished",
    )
    config.add_arguments(leaks)
    leaks.set_defaults(func=cmd_leaks)

    _add_dev_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except config.ConfigError as exc:
        print(f"provisioner: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
