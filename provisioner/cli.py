"""Command line: `provisioner run`, `leaks`, `webhook`, `migrate-storage` and `dev ...`.

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
import os
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from provisioner import __version__, config, tracing

if TYPE_CHECKING:
    import kopf

    from provisioner.access.iam import AccessSettings
    from provisioner.aws.session import Aws, AwsSettings
    from provisioner.kube.client import Kube
    from provisioner.reconciler.engine import Reconciler


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
    from provisioner.aws.budget import BudgetSettings
    from provisioner.aws.session import AwsSettings

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
    # operator never uses: it logs in itself (provisioner.kube.login). The image has none.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    import kopf

    from provisioner.access.iam import AccessSettings
    from provisioner.aws.budget import BudgetSpecError
    from provisioner.kinds.registry import make_aws
    from provisioner.runtime import footprint
    from provisioner.runtime.handlers import register
    from provisioner.webhook.server import CrdError

    settings = config.from_args(args)
    try:
        aws_settings = _aws_settings(settings)
    except BudgetSpecError as exc:
        return _fail(str(exc))
    try:
        footprint.install()
    except RuntimeError as exc:  # a kopf other than the pinned one
        return _fail(str(exc))
    _configure_logging(settings, args.verbose)
    _configure_tracing()
    access_settings = AccessSettings(settings.access, settings.oidc_issuer, settings.eks_cluster)
    if problem := access_settings.problem():
        return _fail(problem)
    aws = make_aws(aws_settings)
    kube, reconciler = _reconciler(settings, aws, access_settings)
    if settings.metrics_port:
        _serve_metrics(settings.metrics_port, aws)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, settings, aws)
    operator = _operator(settings, registry)
    # The operator's own account (GetCallerIdentity) is asked while the operator waits for
    # the API server, not by the first resources: one STS call per process.
    aws.ask_own_account_in_background()
    try:
        asyncio.run(_with_webhook(settings, kube, operator))
    except CrdError as exc:
        print(f"provisioner: {exc}", file=sys.stderr)
        return 2
    finally:
        tracing.shutdown()  # the spans still batched are sent
    return 0


def _configure_tracing() -> None:
    """Traces when the OTEL_* variables ask for them (provisioner/tracing.py); the log lines
    of a traced pass then carry its `trace_id`."""
    if not tracing.setup(version=__version__):
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(tracing.TraceIdFilter())
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    logging.getLogger("provisioner").info("tracing on: spans go to %s (OTLP/HTTP)", endpoint)


def _configure_logging(settings: config.Settings, verbose: bool) -> None:
    import kopf

    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
        log_prefix=settings.log_format != "json",
        log_refkey="object" if settings.log_format == "json" else None,
    )
    for noisy in ("botocore", "boto3", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _reconciler(
    settings: config.Settings, aws: Aws, access_settings: AccessSettings
) -> tuple[Kube, Reconciler]:
    """The API server's client, and the reconciler of every kind with its Events' threads."""
    from provisioner.access.grants import Access
    from provisioner.kinds.registry import make_clients
    from provisioner.kube.client import Kube
    from provisioner.reconciler.engine import Reconciler
    from provisioner.runtime.accounts_controller import account_directory
    from provisioner.runtime.classes_controller import class_directory
    from provisioner.runtime.events import event_poster

    # Two Events per resource on its way to Ready: half as many threads as the passes', so
    # that they keep up with them when the API server answers slowly.
    event_threads = max(2, settings.workers // 2)
    # A connection for each thread that calls the API server: the passes', the looks' (half
    # as many) and the Events'.
    kube = Kube(pool_size=settings.workers + settings.workers // 2 + event_threads + 4)
    events = ThreadPoolExecutor(max_workers=event_threads, thread_name_prefix="events")
    directory = account_directory(kube) if settings.accounts else None
    reconciler = Reconciler(
        settings,
        kube,
        make_clients(aws),
        event_poster(kube, events),
        directory=directory,
        own_account=aws.account_id,
        classes=class_directory(kube, directory) if directory is not None else None,
    )
    reconciler.access = Access(
        access_settings, settings.cluster_id, aws, kube, reconciler.in_thread
    )
    return kube, reconciler


def _serve_metrics(port: int, aws: Aws) -> None:
    from provisioner.runtime import metrics

    aws.sessions.listeners.append(
        lambda account, outcome: metrics.ASSUME_ROLE.labels(account, outcome).inc()
    )
    metrics.serve(port)


def _operator(
    settings: config.Settings, registry: kopf.OperatorRegistry
) -> Coroutine[Any, Any, None]:
    """kopf's operator serving `registry` (not started yet)."""
    import kopf

    logging.getLogger("provisioner").info(
        "starting: region=%s endpoint=%s cluster-id=%s namespaces=%s resync=%ss",
        settings.region,
        settings.endpoint_url or "aws",
        settings.cluster_id,
        ",".join(settings.namespaces) or "all",
        settings.resync_seconds,
    )
    return kopf.operator(
        registry=registry,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        liveness_endpoint=f"http://0.0.0.0:{settings.liveness_port}/healthz",
    )


async def _with_webhook(
    settings: config.Settings, kube: Kube, operator: Coroutine[Any, Any, Any]
) -> None:
    """The CRDs checked, the conversion webhook serving (unless off), then the operator."""
    from provisioner.webhook import server as webhook

    hook, upkeep = None, None
    try:
        if settings.webhook:
            hook = await webhook.serve(settings, kube, asyncio.to_thread)
            upkeep = asyncio.create_task(hook.maintain())
        else:
            await webhook.check_crds(kube, asyncio.to_thread)
        await operator
    finally:
        operator.close()  # never awaited when the CRDs were refused
        if upkeep is not None:
            upkeep.cancel()
        if hook is not None:
            await hook.stop()


def cmd_webhook(args: argparse.Namespace) -> int:
    """Only the conversion webhook: for a dev stack whose operator restarts, or a cluster
    that runs it apart from the operator."""
    from provisioner.kube.client import Kube
    from provisioner.webhook import server as webhook

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = config.from_args(args)
    kube = Kube(pool_size=4)
    if settings.metrics_port:
        from provisioner.runtime import metrics

        # Its own series only: none of the operator's, so that an operator that is not
        # scraped still shows as missing.
        metrics.serve(settings.metrics_port, operator=False)

    async def serve() -> None:
        hook = await webhook.serve(settings, kube, asyncio.to_thread)
        try:
            await hook.maintain()
        finally:
            await hook.stop()

    try:
        asyncio.run(serve())
    except webhook.CrdError as exc:
        print(f"provisioner: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_leaks(args: argparse.Namespace) -> int:
    from provisioner.aws.budget import BudgetSpecError
    from provisioner.aws.errors import CloudError
    from provisioner.kinds.registry import make_aws
    from provisioner.kube.client import Kube, KubeError
    from provisioner.tools import leaks

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
    if args.metrics_file:
        leaks.write_metrics(findings, args.metrics_file)
    return 1 if findings else 0


def cmd_migrate_storage(args: argparse.Namespace) -> int:
    from provisioner.tools import migrate

    return migrate.main(args.kubeconfig, args.crd)


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
    leaks.add_argument(
        "--metrics-file",
        metavar="PATH",
        help="also write the findings as Prometheus metrics (provisioner_leaks{problem,kind}) "
        "to PATH, for node_exporter's textfile collector or a Pushgateway",
    )
    leaks.set_defaults(func=cmd_leaks)

    migrate = sub.add_parser(
        "migrate-storage",
        help="store every object of the CRDs at their storage version, then drop the older "
        "versions from status.storedVersions",
    )
    migrate.add_argument(
        "--kubeconfig",
        help="the admin's kubeconfig (default: in a pod its ServiceAccount, else $KUBECONFIG "
        "or ~/.kube/config)",
    )
    migrate.add_argument(
        "--crd",
        action="append",
        metavar="NAME",
        help="only this CRD (repeatable; default: "
        "databaseinstances, s3buckets, queues and topics.cloud.provisioner.dev)",
    )
    migrate.set_defaults(func=cmd_migrate_storage)

    hook = sub.add_parser(
        "webhook", help="serve only the conversion webhook (v1alpha1 <-> v1beta1) of the CRDs"
    )
    config.add_arguments(hook)
    hook.set_defaults(func=cmd_webhook)

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
