"""`provisioner dev up|status|down|build|demo`: the local stack, outside the operator's package."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fail(message: str) -> int:
    print(f"provisioner: {message}", file=sys.stderr)
    return 1


def _dev_stack():
    from provisioner_dev.stack import DevStack

    return DevStack(Path.cwd() / ".dev")


def _cloud_profile(args: argparse.Namespace):
    """The CloudProfile asked for (None: instant, plain moto); ProfileError if it is wrong."""
    from provisioner_dev.cloudprofile import requested_profile

    return requested_profile(args.cloud_profile, args.time_scale, args.duration, args.throttle)


def cmd_dev_up(args: argparse.Namespace) -> int:
    from provisioner_dev.binaries import BuildError
    from provisioner_dev.cloudprofile import ProfileError
    from provisioner_dev.processes import StartError

    try:
        cloud = _cloud_profile(args)
    except ProfileError as exc:
        return _fail(str(exc))
    stack = _dev_stack()
    running = stack.load()
    external = Path(args.kubeconfig).resolve() if args.kubeconfig else None
    if running and stack.running(running):
        have = running.get("cloud_profile", "instant")
        if have != args.cloud_profile:
            return _fail(
                f"the running stack has cloud profile {have!r}: `provisioner dev down` first"
            )
        has = Path(running["kubeconfig"]) if running.get("external_cluster") else None
        if has != external:
            where = f"the cluster in {has}" if has else "its own control plane"
            return _fail(f"the running stack uses {where}: `provisioner dev down` first")
        if args.observability and not running.get("observability"):
            return _fail(
                "the running stack has no observability backends: `provisioner dev down` first"
            )
    backends = tuple(observability_names()) if args.observability else ()
    try:
        state = stack.up(
            with_operator=not args.no_operator,
            cloud=cloud,
            kubeconfig=external,
            backends=backends,
        )
    except (BuildError, StartError, RuntimeError, ProfileError) as exc:
        return _fail(str(exc))
    _print_up(state)
    return 0


def observability_names() -> list[str]:
    from provisioner_dev.observability import names

    return names()


def _print_up(state: dict) -> None:
    if state.get("external_cluster"):
        print(f"cluster:       {state['external_cluster']} (yours; CRDs installed by dev up)")
    else:
        print(f"control plane: {state['controlplane']['apiserver_url']}")
    print(f"moto:          {state['moto_url']}")
    if state.get("cloud_profile", "instant") != "instant":
        print(f"cloud:         {state['cloud_url']} ({state['cloud_profile']} profile)")
    print(f"kubeconfig:    {state['kubeconfig']}")
    admission = state.get("admission") or {}
    if admission.get("verified"):
        how = "stamped by the API server and" if admission.get("stamped") else "only the creator's,"
        print(f"requested-by:  {how} never changed (the chart's admission policies)")
    if state.get("oidc_issuer"):
        print(f"spec.access:   irsa, issuer {state['oidc_issuer']} (an IAM OIDC provider in moto)")
    for name, backend in (state.get("observability") or {}).items():
        print(f"{name + ':':14} {backend['url']}")
    if state.get("metrics_port"):
        print(f"metrics:       http://127.0.0.1:{state['metrics_port']}/metrics (the operator's)")
    print("environment:   source .dev/env")
    print(f"processes:     {', '.join(f'{k}={v}' for k, v in state['pids'].items())}")
    if "operator" not in state["pids"]:
        print("operator:      not started (--no-operator); run your own: provisioner run")


def cmd_dev_demo(args: argparse.Namespace) -> int:
    from provisioner_dev import demo
    from provisioner_dev.binaries import BuildError
    from provisioner_dev.processes import StartError

    try:
        return demo.run(_dev_stack())
    except (BuildError, StartError, RuntimeError) as exc:
        return _fail(str(exc))


def cmd_dev_status(args: argparse.Namespace) -> int:
    """Exit 0 when everything `dev up` started runs (the operator too, unless --no-operator)."""
    stack = _dev_stack()
    state = stack.load()
    if not state:
        print("not running (no .dev/state.json)")
        return 1
    for name, proc in state["processes"].items():
        print(f"{name:24} pid {proc['pid']:<8} {'running' if stack.is_alive(proc) else 'DEAD'}")
    operator = stack.operator(state)
    if operator == "not started":
        print(f"{'operator':24} not started (--no-operator)")
    problems = stack.dead(state)
    if problems:
        print(
            f"NOT RUNNING: {'; '.join(problems)}; "
            "`provisioner dev up` starts over with a new control plane and moto"
        )
    else:
        where = state.get("external_cluster") or state["controlplane"]["apiserver_url"]
        print(f"apiserver {where}: ready")
        print(f"moto      {state['moto_url']}: ready")
        if operator == "dead":
            print("`provisioner dev up` starts the operator again and keeps the rest")
    dead_backends = stack.dead_backends(state)
    for name, backend in (state.get("observability") or {}).items():
        print(f"{name + ':':10} {backend['url']} {'DEAD' if name in dead_backends else 'ready'}")
    if dead_backends and not problems:
        print(f"`provisioner dev up` starts {', '.join(dead_backends)} again and keeps the rest")
    if args.json:
        print(json.dumps(state, indent=2))
    return 1 if problems or operator == "dead" or dead_backends else 0


def cmd_dev_down(args: argparse.Namespace) -> int:
    stopped = _dev_stack().down()
    print("stopped" if stopped else "nothing was running")
    return 0


def cmd_dev_build(args: argparse.Namespace) -> int:
    from provisioner_dev.binaries import BuildError, ensure_binaries

    try:
        built = ensure_binaries() if not args.only_observability else {}
        if args.observability or args.only_observability:
            built.update(observability_binaries())
        for name, path in built.items():
            print(f"{name}: {path}")
    except BuildError as exc:
        return _fail(str(exc))
    return 0


def observability_binaries() -> dict[str, Path]:
    """Prometheus, promtool and Jaeger (`dev up --observability`, and the tests of the alerts,
    dashboards and traces), built from their pinned Go modules once per machine."""
    from provisioner_dev.binaries import BuildError
    from provisioner_dev.jaeger import ensure_jaeger
    from provisioner_dev.prometheus import ensure_prometheus

    built: dict[str, Path] = {}
    failed: list[str] = []
    for build in (ensure_prometheus, lambda: {"jaeger": ensure_jaeger()}):
        try:
            built.update(build())
        except BuildError as exc:  # the other one is still built
            failed.append(str(exc))
    if failed:
        raise BuildError("; ".join(failed))
    return built


def cmd_dev_image(args: argparse.Namespace) -> int:
    from provisioner_dev.image import ImageError, build, image_contents

    try:
        image = build()
    except ImageError as exc:
        return _fail(str(exc))
    what = f"built in {image.seconds:.0f} s" if image.built else "already built, inputs unchanged"
    print(f"{image.ref} (also tagged {image.version_tag}): {what}")
    for line in image_contents(image.ref):
        print(f"  {line}")
    return 0


def _add_build(dev_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = dev_sub.add_parser("build", help="build or verify the cached control-plane binaries")
    build.add_argument(
        "--observability",
        action="store_true",
        help="also Prometheus, promtool (hack/prometheus) and Jaeger (hack/jaeger)",
    )
    build.add_argument(
        "--only-observability",
        action="store_true",
        help="Prometheus, promtool and Jaeger alone",
    )
    build.set_defaults(func=cmd_dev_build)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="a local control plane, moto and the operator")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser(
        "up",
        help="start what is not running; keeps a running control plane and moto (idempotent)",
    )
    up.add_argument(
        "--no-operator",
        action="store_true",
        help="no operator (one that an earlier `dev up` started is stopped): run your own",
    )
    up.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="use the cluster you have (kind, k3d, minikube, a dev EKS...) instead of starting "
        "one: installs the CRDs there (refused if they exist), runs moto and the operator "
        "here; `dev down` removes only what it added",
    )
    up.add_argument(
        "--cloud-profile",
        default="instant",
        help="instant (moto as is, the default) or aws-like (AWS's durations, throttling and "
        "name holds, played by a proxy in front of moto)",
    )
    up.add_argument(
        "--observability",
        action="store_true",
        help="also run Prometheus (built from hack/prometheus once, cached) scraping the "
        "operator's metrics every second, and Jaeger (hack/jaeger) receiving its traces; "
        "print their addresses; `dev down` stops them",
    )
    from provisioner_dev.cloudprofile import add_profile_arguments, names_help

    add_profile_arguments(up)
    up.epilog = f"aws-like profile: provisioner_dev/profiles/aws-like.yaml; {names_help()}"
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
    _add_build(dev_sub)
    dev_sub.add_parser(
        "image",
        help="build the operator's image from the Dockerfile with buildah "
        "(base made from Debian's packages; needs root)",
    ).set_defaults(func=cmd_dev_image)
