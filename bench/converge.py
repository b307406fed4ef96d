#!/usr/bin/env python3
"""Convergence benchmark: N custom resources from nothing to Ready, idle, changed, and gone.

Starts its own control plane (etcd, kube-apiserver, kube-controller-manager), moto's server
(with its request recorder on) and the operator as a child process, then:

1. create   N CRs across --namespaces namespaces as fast as the client can, and wait (LIST
            polls every 0.5 s, no per-object GETs) until every one is Ready;
2. idle     --idle seconds doing nothing, counting the API server's writes;
3. restart  the operator stopped and started again; its AWS calls and writes in the first
            --restart seconds, with nothing changed;
4. change   --changes random CRs get a mutable spec field patched; per change, the time from
            the patch returning to moto reflecting it;
5. delete   all of them, wait until every CR is gone, count what is left in moto.

It reads kube-apiserver's own `apiserver_request_total` for the writes, moto's recording for the
AWS calls, and /proc for the operator's peak RSS and CPU time, then prints one table (and
--json PATH). Exit status 1 if cloud resources are left, a create failed, or a phase timed out;
130 on Ctrl-C. Everything it started is stopped at the end unless --keep.

    .venv/bin/python bench/converge.py --n 1000 --namespaces 10 --mix 1:1:1:1 --idle 60
    .venv/bin/python bench/converge.py --cloud-profile aws-like --mix 1:3:3:3 --idle 10

With `--cloud-profile aws-like` the operator talks to moto through provisioner_dev/awslike.py
(AWS's slow states, name holds and throttling); the table then also has the Synced=False
conditions seen (by class: throttling or not) and the time to all Ready next to the shortest
the cloud's own limits allow (bench/lib/bound.py).

See bench/README.md for what each figure means and the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lib import log, stop_on_signals  # noqa: E402
from bench.lib.measure import source_fingerprint  # noqa: E402
from bench.lib.options import Options  # noqa: E402
from bench.lib.profile import PySpy, profile_text, summarize_profile  # noqa: E402
from bench.lib.report import figures, summary, table  # noqa: E402
from bench.lib.run import run  # noqa: E402
from bench.lib.session import Bench  # noqa: E402
from bench.lib.workload import MIX_NAMES, split_mix  # noqa: E402
from provisioner_dev.cloudprofile import (  # noqa: E402
    PROFILES,
    CloudProfile,
    ProfileError,
    add_profile_arguments,
    names_help,
    requested_profile,
)
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(
        prog="bench/converge.py",
        description="Convergence benchmark of the provisioner operator (see bench/README.md).",
    )
    add_phase_arguments(p)
    add_run_arguments(p)
    add_profile_arguments(p)
    p.epilog = f"aws-like profile: {names_help()}"
    a = p.parse_args(argv)
    if a.n < 1 or a.namespaces < 1:
        p.error("--n and --namespaces must be >= 1")
    if a.accounts < 0 or (a.accounts and a.changes):
        p.error("--accounts needs --changes 0 (changes are checked in the operator's account)")
    if a.replicas < 1:
        p.error("--replicas must be >= 1")
    if (a.replicas > 1 or a.sharding) and a.restart:
        p.error("--replicas/--sharding need --restart 0 (the restart phase restarts one operator)")
    a.sharding = a.sharding or a.replicas > 1
    parse_cloud_profile(a.cloud_profile, a.time_scale, a.duration, a.throttle)
    # Every option's dest is a field of Options.
    return Options(**{**vars(a), "py_spy": a.py_spy.resolve() if a.py_spy else None})


def add_phase_arguments(p: argparse.ArgumentParser) -> None:
    """What is created, and what each phase does."""
    p.add_argument("--n", type=int, default=1000, help="number of CRs (default 1000)")
    even = ":".join("1" for _ in MIX_NAMES.split(":"))
    p.add_argument("--mix", default=even, help=f"{MIX_NAMES} weights (default {even})")
    p.add_argument("--namespaces", type=int, default=10, help="spread over this many (10)")
    p.add_argument(
        "--accounts",
        type=int,
        default=0,
        help="spread the namespaces over this many CloudAccounts (default 0: the operator's "
        "own account); needs --changes 0",
    )
    p.add_argument("--idle", type=float, default=60, help="idle phase seconds (default 60)")
    p.add_argument(
        "--restart",
        type=float,
        default=30,
        help="restart the operator, count its calls for this many seconds (30; 0: skip)",
    )
    p.add_argument("--changes", type=int, default=100, help="spec changes to time (100)")
    p.add_argument("--timeout", type=float, default=600, help="per phase, seconds (600)")
    p.add_argument("--keep", action="store_true", help="leave everything running at the end")
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="ARG",
        help="passed to `provisioner run` (repeatable; use --operator-arg=--workers=64)",
    )
    p.add_argument("--json", type=Path, dest="json_path", metavar="PATH", help="write figures")
    p.add_argument(
        "--create-method",
        choices=["api", "kubectl"],
        default="api",
        help="api: POSTs from a thread pool (default); kubectl: `kubectl create -f -` per "
        "namespace, all namespaces in parallel",
    )
    p.add_argument("--create-workers", type=int, default=16, help="threads for api (16)")
    p.add_argument("--change-workers", type=int, default=4, help="changes in flight (4)")
    p.add_argument("--seed", type=int, default=1, help="for the kind order and the changes")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """py-spy, the operator's replicas, the work directory and the cloud."""
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="PATH",
        help="attach `py-spy record --format raw` to the operator from the first create "
        "until all are Ready, write the samples to PATH and summarise the top functions",
    )
    p.add_argument("--py-spy-rate", type=int, default=100, help="samples per second (100)")
    p.add_argument(
        "--py-spy-mode",
        choices=sorted(PySpy.MODES),
        default="cpu",
        help="cpu: threads py-spy sees as active (default); gil: only the thread holding the "
        "GIL (Python CPU time); wall: every thread, waiting ones too",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="operator replicas, sharded (--sharding=on) when more than one (default 1)",
    )
    p.add_argument(
        "--sharding",
        action="store_true",
        help="run the operator(s) with --sharding=on, also a single one",
    )
    p.add_argument("--workdir", type=Path, help="logs and data here (default: a temp dir)")
    p.add_argument(
        "--cloud-profile",
        default="instant",
        help=f"{' or '.join(PROFILES)}: moto as it is (default), or behind the aws-like proxy "
        "(AWS's slow states, name holds and throttling; provisioner_dev/profiles/aws-like.yaml)",
    )


def parse_cloud_profile(
    name: str, time_scale: str | None, durations: list[str], throttles: list[str]
) -> CloudProfile | None:
    """The profile asked for; a bad one ends the program with one line saying why."""
    try:
        return requested_profile(name, time_scale, durations, throttles)
    except ProfileError as exc:
        raise SystemExit(f"bench/converge.py: {exc}") from None


def replica_runs(opts: Options) -> list[tuple[list[str], dict[str, str], str]]:
    """(args, env, log file) of each operator process: one, or --replicas sharded ones, each
    naming itself in its AWS calls' user agent (app/<shard>: the recording tells them apart)."""
    if not opts.sharding:
        return [(opts.operator_args, {}, "operator.log")]
    return [
        (
            [*opts.operator_args, "--sharding=on", f"--shard-name=r{i}"],
            {"PROVISIONER_NAMESPACE": "default", "AWS_SDK_UA_APP_ID": f"r{i}"},
            f"operator-r{i}.log",
        )
        for i in range(opts.replicas)
    ]


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    counts = split_mix(opts.n, opts.mix)
    cloud = parse_cloud_profile(opts.cloud_profile, opts.time_scale, opts.duration, opts.throttle)

    stop_on_signals()
    if opts.workdir:
        workdir = opts.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="provisioner-bench-"))
    # moto counts a database's automated snapshot against its snapshot quota (1,000 by
    # default), and refuses every database past the 1,000th with SnapshotQuotaExceeded; RDS
    # has no such limit on automated snapshots. Its server inherits this environment.
    os.environ.setdefault("MOTO_RDS_SNAPSHOT_LIMIT", "1000000")
    stack = Stack(dir=workdir, record=True, cloud_profile=cloud, cloud_seed=opts.seed)
    code = 1
    load = os.getloadavg()
    try:
        code = measure(opts, stack, cloud, counts, workdir, load)
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        code = 130
    except Exception:  # noqa: BLE001 - reported; the stack is stopped below
        traceback.print_exc()
        code = 1
    finally:
        stop_or_keep(opts, stack, workdir, code)
    return code


def start_stack(
    opts: Options, stack: Stack, cloud: CloudProfile | None, workdir: Path, source: dict[str, Any]
) -> float:
    """The control plane, moto (behind the aws-like proxy if asked) and the operator(s):
    the seconds that took."""
    what = "moto" if cloud is None else f"moto behind the {cloud.name} proxy"
    log(f"starting the control plane, {what} and the operator in {workdir}")
    newest = f"{source['newest']} {source['newest_mtime']}"
    log(f"operator source {source['sha256']} (newest file: {newest})")
    started = time.monotonic()
    stack.start()
    for args, extra_env, log_name in replica_runs(opts):
        stack.start_operator(
            args=args,
            env=extra_env,
            cluster_id="bench",
            log=(stack.log_dir or stack.dir) / log_name,
        )
    setup_seconds = time.monotonic() - started
    log(f"up in {setup_seconds:.1f}s; pids {stack.pids()}")
    return setup_seconds


def measure(
    opts: Options,
    stack: Stack,
    cloud: CloudProfile | None,
    counts: dict[str, int],
    workdir: Path,
    load: tuple[float, float, float],
) -> int:
    """The stack started, the benchmark run, its table printed (and its JSON written): the
    exit status."""
    source = source_fingerprint()
    setup_seconds = start_stack(opts, stack, cloud, workdir, source)
    api = KubeJson(stack.kubeconfig, pool_size=max(32, opts.create_workers))
    bench = Bench(opts, stack, api)
    try:
        run(bench)
        results = bench.results
        doc = figures(opts, counts, results, source)
        failed = bool(bench.timeouts or bench.errors)
        leaked = (results.get("cloud_resources_left") or {}).get("total", 1) != 0
        code = 1 if failed or leaked else 0
        profile = summarize_profile(opts.py_spy) if opts.py_spy else None
        if profile is not None:
            profile["mode"] = opts.py_spy_mode
        document = {
            **summary(doc),
            "ok": code == 0,
            "timeouts": bench.timeouts,
            "errors": bench.errors[:50],
            "machine": {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load]},
            "setup_seconds": round(setup_seconds, 1),
            "operator_args": opts.operator_args,
            "operator_source": source,
            "aws_calls_counted_with": "moto recorder (MOTO_ENABLE_RECORDING)"
            + ("" if cloud is None else "; at the aws-like proxy: its stats"),
            "cloud_profile": None if cloud is None else {"name": cloud.name, "args": cloud.args},
            "details": results,
            "profile": profile,
            "workdir": str(workdir) if opts.keep or opts.workdir is not None or code else None,
        }
        print_report(opts, bench, doc, profile, leaked)
        if opts.json_path:
            opts.json_path.write_text(json.dumps(document, indent=2) + "\n")
        return code
    finally:
        if bench.spy is not None:
            bench.spy.stop()


def print_report(
    opts: Options, bench: Bench, doc: dict[str, Any], profile: dict[str, Any] | None, leaked: bool
) -> None:
    """The table, the profile, AssumeRole calls and what failed."""
    results = bench.results
    print(table(doc))
    if profile:
        print()
        print(profile_text(profile))
    if "assume_role_calls" in results:
        restarts = 1 if opts.restart > 0 else 0
        print(
            f"AssumeRole calls: {results['assume_role_calls']} for {opts.n} CRs over "
            f"{opts.accounts} accounts ({1 + restarts} operator process"
            f"{'es' if restarts else ''})"
        )
    for problem in bench.timeouts + bench.errors[:10]:
        print(f"FAILED: {problem}")
    if leaked and "cloud_resources_left" in results:
        print(f"FAILED: cloud resources left: {results['cloud_resources_left']}")


def stop_or_keep(opts: Options, stack: Stack, workdir: Path, code: int) -> None:
    """With --keep: leave everything running and say how to stop it; else stop the stack,
    and remove its directory after a clean run without --workdir."""
    if opts.keep and stack.cloud.proc is not None:
        pids = stack.pids()
        env = workdir / "env"
        stack.write_env(env)
        log(f"--keep: left running: {pids}; `source {env}`")
        ids = ", ".join(str(pid) for pid in reversed(pids.values()))
        log(
            "stop with: .venv/bin/python -c 'from provisioner_dev.processes import stop; "
            f"[stop(p) for p in ({ids})]'"
        )
    else:
        stack.stop()
        if code == 0 and not (opts.keep or opts.workdir is not None):
            stack.remove()
        else:
            log(f"logs and data kept in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
