#!/usr/bin/env python3
"""Side by side: AWS Controllers for Kubernetes' s3-controller and this operator, N buckets each.

One control plane and one moto (its request recorder on) for both, one controller at a time:

1. ACK: its CRDs applied, its controller started as a child process against the same
   kubeconfig and moto (--watch-namespace=ack-bench), N `Bucket` CRs (s3.services.k8s.aws,
   spec.name unique) created as fast as the API takes them, until every one is
   `ACK.ResourceSynced=True`; all deleted, until gone; the controller stopped.
2. This operator (`provisioner run`, its defaults): N `S3Bucket` CRs with `spec: {}` in
   provisioner-bench, until every one is `Ready=True`; all deleted; the operator stopped.

For each: the time to all Ready/Synced, AWS calls per bucket to Ready (moto's recording, from
the first create until the controller made no call for 3 s; grouped by the bucket each names),
the controller's RSS before the first CR, sampled every 0.2 s (VmRSS) and its VmHWM at the
end (/proc/<pid>/status), CPU seconds, API writes, time to all deleted and the buckets left in
moto. A table, and --json PATH. Everything started is stopped at the end, on failure, on
Ctrl-C and on SIGTERM.

    .venv/bin/python bench/ack.py --n 500
    .venv/bin/python bench/ack.py --n 500 --json /tmp/ack.json

ACK's controller is a Go binary built once per machine and cached in
~/.cache/provisioner/ack-s3-controller-<version>/ (with its CRDs), like the control plane's
binaries (provisioner_dev/binaries.py): through the Go module proxy, or `--ack-binary PATH
--ack-crds DIR` to put one built elsewhere into that cache. See bench/README.md, "Side by side
with ACK's s3-controller".
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
from bench.lib.ack_controller import (  # noqa: E402
    ACK_VERSION,
    AckController,
    adopt_ack,
    ensure_ack,
    moto_with_aws_defaults,
)
from bench.lib.ack_report import table, targets  # noqa: E402
from bench.lib.ack_run import Run, ack_side, ours_side  # noqa: E402
from bench.lib.measure import source_fingerprint  # noqa: E402
from provisioner_dev import binaries  # noqa: E402
from provisioner_dev.crds import install_crds  # noqa: E402
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/ack.py",
        description="ACK's s3-controller and this operator side by side (bench/README.md).",
    )
    p.add_argument("--n", type=int, default=500, help="buckets per controller (500)")
    p.add_argument(
        "--only", choices=["ack", "ours"], help="run one side only (default: ACK, then ours)"
    )
    p.add_argument("--timeout", type=float, default=900, help="per phase, seconds (900)")
    p.add_argument("--create-workers", type=int, default=16, help="POSTs in flight (16)")
    p.add_argument("--json", type=Path, dest="json_path", metavar="PATH", help="write figures")
    p.add_argument("--workdir", type=Path, help="logs and data here, kept (default: a temp dir)")
    p.add_argument("--ack-version", default=ACK_VERSION, help=f"ACK's version ({ACK_VERSION})")
    p.add_argument(
        "--ack-binary",
        type=Path,
        help="an ACK s3-controller built elsewhere: put into the cache (with --ack-crds)",
    )
    p.add_argument(
        "--ack-crds", type=Path, help="with --ack-binary: the module's root, or a dir of CRDs"
    )
    p.add_argument(
        "--ack-arg",
        action="append",
        default=[],
        dest="ack_args",
        metavar="ARG",
        help="passed to ACK's controller (repeatable; --ack-arg=--log-level=debug)",
    )
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="ARG",
        help="passed to `provisioner run` (repeatable)",
    )
    a = p.parse_args(argv)
    if a.n < 1:
        p.error("--n must be >= 1")
    if bool(a.ack_binary) != bool(a.ack_crds):
        p.error("--ack-binary and --ack-crds go together")
    return a


def run_ack(
    stack: Stack, api: KubeJson, opts: argparse.Namespace, run_id: str, binary: Path
) -> dict[str, Any]:
    side = ack_side(run_id)
    run = Run(side, opts.n, stack, api, opts)
    ack = AckController(
        binary=binary,
        kubeconfig=str(stack.kubeconfig),
        endpoint_url=stack.cloud.url,
        namespace=side.namespace,
        extra_args=opts.ack_args,
        log=stack.dir / "ack-s3-controller.log",
    )
    started = time.monotonic()
    try:
        ack.start()
        assert ack.proc is not None
        run.result["startup_seconds"] = round(time.monotonic() - started, 2)
        log(f"{side.label} up (pid {ack.proc.pid})")
        try:
            run.run(ack.proc.pid)
        except Exception as exc:  # noqa: BLE001 - reported; the controller is stopped below
            traceback.print_exc()
            run.errors.append(f"{type(exc).__name__}: {exc}")
        run.finish()
    finally:
        ack.stop()
    return run.result


def run_ours(stack: Stack, api: KubeJson, opts: argparse.Namespace) -> dict[str, Any]:
    side = ours_side()
    run = Run(side, opts.n, stack, api, opts)
    started = time.monotonic()
    op = stack.start_operator(args=opts.operator_args, cluster_id="bench")
    try:
        assert op.proc is not None
        run.result["startup_seconds"] = round(time.monotonic() - started, 2)
        log(f"{side.label} up (pid {op.proc.pid})")
        try:
            run.run(op.proc.pid)
        except Exception as exc:  # noqa: BLE001 - reported; the operator is stopped below
            traceback.print_exc()
            run.errors.append(f"{type(exc).__name__}: {exc}")
        run.finish()
    finally:
        op.stop()
    return run.result


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    stop_on_signals()
    binary: Path | None = None
    crds: Path | None = None
    if opts.only != "ours":
        try:
            if opts.ack_binary:
                binary, crds = adopt_ack(opts.ack_version, opts.ack_binary, opts.ack_crds)
            else:
                binary, crds = ensure_ack(opts.ack_version)
        except binaries.BuildError as exc:
            print(f"bench/ack.py: {exc}", file=sys.stderr)
            return 1
        log(f"ACK s3-controller {opts.ack_version}: {binary}")
    if opts.workdir:
        workdir = opts.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="provisioner-bench-ack-"))
    stack = Stack(dir=workdir, record=True)
    moto_with_aws_defaults(stack)
    code = 1
    doc: dict[str, Any] = {
        "n": opts.n,
        "ack_version": opts.ack_version,
        "ack_binary": None
        if binary is None
        else {"path": str(binary), "sha256": binaries._sha256(binary)},
        "operator_source": source_fingerprint(),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0]},
    }
    try:
        code = compare(opts, stack, workdir, binary, crds, doc)
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        code = 130
    except Exception:  # noqa: BLE001 - reported; the stack is stopped below
        traceback.print_exc()
        code = 1
    finally:
        stack.stop()
        if code == 0 and not opts.workdir:
            stack.remove()
        else:
            log(f"logs and data kept in {workdir}")
    return code


def compare(
    opts: argparse.Namespace,
    stack: Stack,
    workdir: Path,
    binary: Path | None,
    crds: Path | None,
    doc: dict[str, Any],
) -> int:
    """The stack started, ACK's side then ours, the table printed (and the JSON written):
    the exit status."""
    log(f"starting the control plane and moto in {workdir}")
    stack.start()
    api = KubeJson(stack.kubeconfig, pool_size=max(32, opts.create_workers))
    if binary is not None and crds is not None:
        install_crds(stack.kubeconfig, crds)
        doc["ack"] = run_ack(stack, api, opts, f"{int(time.time()) % 100000}", binary)
    if opts.only != "ack":
        doc["ours"] = run_ours(stack, api, opts)
    doc["targets"] = targets(doc)
    ok = all(doc[k].get("ok") for k in ("ack", "ours") if k in doc)
    doc["ok"] = ok
    print(table(doc))
    if opts.json_path:
        opts.json_path.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
