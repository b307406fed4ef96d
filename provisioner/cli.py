"""Command line: `provisioner run`, `provisioner dev up|status|down|build`."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioner import config


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


def cmd_run(args: argparse.Namespace) -> int:
    _limit_malloc_arenas()
    import kopf

    from provisioner.cloud import make_clients
    from provisioner.cloud.aws import Aws, AwsSettings
    from provisioner.kube import Kube
    from provisioner.operator import event_poster, register
    from provisioner.reconcile import Reconciler

    settings = config.from_args(args)
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
        log_prefix=settings.log_format != "json",
        log_refkey="object" if settings.log_format == "json" else None,
    )
    for noisy in ("botocore", "boto3", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    aws = Aws(AwsSettings(region=settings.region, endpoint_url=settings.endpoint_url))
    kube = Kube(pool_size=settings.workers + 4)
    events = ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")
    reconciler = Reconciler(settings, kube, make_clients(aws), event_poster(kube, events))
    if settings.metrics_port:
        from provisioner import metrics

        metrics.serve(settings.metrics_port)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, settings)
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
    from provisioner.cloud.aws import Aws, AwsSettings
    from provisioner.cloud.errors import CloudError
    from provisioner.kube import Kube, KubeError

    settings = config.from_args(args)
    try:
        findings = leaks.find(
            Aws(AwsSettings(region=settings.region, endpoint_url=settings.endpoint_url)),
            Kube(pool_size=4),
            settings.cluster_id,
        )
    except (CloudError, KubeError) as exc:
        return _fail(f"cannot list resources: {exc}")
    print(leaks.report(findings))
    return 1 if findings else 0


def _dev_stack():
    from provisioner.dev.stack import DevStack

    return DevStack(Path.cwd() / ".dev")


def cmd_dev_up(args: argparse.Namespace) -> int:
    from provisioner.dev.binaries import BuildError
    from provisioner.dev.processes import StartError

    stack = _dev_stack()
    try:
        state = stack.up(with_operator=not args.no_operator)
    except (BuildError, StartError, RuntimeError) as exc:
        return _fail(str(exc))
    print(f"control plane: {state['controlplane']['apiserver_url']}")
    print(f"moto:          {state['moto_url']}")
    print(f"kubeconfig:    {state['kubeconfig']}")
    print("environment:   source .dev/env")
    print(f"processes:     {', '.join(f'{k}={v}' for k, v in state['pids'].items())}")
    return 0


def cmd_dev_demo(args: argparse.Namespace) -> int:
    from provisioner.dev import demo
    from provisioner.dev.binaries import BuildError
    from provisioner.dev.processes import StartError

    try:
        return demo.run(_dev_stack())
    except (BuildError, StartError, RuntimeError) as exc:
        return _fail(str(exc))


def cmd_dev_status(args: argparse.Namespace) -> int:
    from provisioner.dev.processes import alive

    stack = _dev_stack()
    state = stack.load()
    if not state:
        print("not running (no .dev/state.json)")
        return 1
    running = stack.running(state)
    for name, pid in state["pids"].items():
        print(f"{name:24} pid {pid:<8} {'running' if alive(pid) else 'DEAD'}")
    print(
        f"apiserver {state['controlplane']['apiserver_url']}: {'ready' if running else 'NOT READY'}"
    )
    if args.json:
        print(json.dumps(state, indent=2))
    return 0 if running else 1


def cmd_dev_down(args: argparse.Namespace) -> int:
    stopped = _dev_stack().down()
    print("stopped" if stopped else "nothing was running")
    return 0


def cmd_dev_build(args: argparse.Namespace) -> int:
    from provisioner.dev.binaries import BuildError, ensure_binaries

    try:
        for name, path in ensure_binaries().items():
            print(f"{name}: {path}")
    except BuildError as exc:
        return _fail(str(exc))
    return 0


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

    dev = sub.add_parser("dev", help="a local control plane, moto and the operator")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser("up", help="start everything (idempotent)")
    up.add_argument("--no-operator", action="store_true", help="do not start the operator")
    up.set_defaults(func=cmd_dev_up)
    dev_sub.add_parser("demo", help="up, apply examples/, show them Ready").set_defaults(
        func=cmd_dev_demo
    )
    status = dev_sub.add_parser("status", help="show what runs")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_dev_status)
    dev_sub.add_parser("down", help="stop everything and remove its data").set_defaults(
        func=cmd_dev_down
    )
    dev_sub.add_parser(
        "build", help="build or verify the cached control-plane binaries"
    ).set_defaults(func=cmd_dev_build)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
