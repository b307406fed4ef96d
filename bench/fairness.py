#!/usr/bin/env python3
"""Fairness between namespaces: one namespace's flood against another's single resource.

Starts its own control plane, moto's server and the operator (cluster-wide, as the chart
runs it by default; `--operator-arg` adds flags), then:

1. idle   one Queue at a time in the namespace `fair-lone`, --idle-samples times: its time
          from the POST to Ready on an otherwise idle operator (the median is the figure);
2. flood  N Queues POSTed in the namespace `fair-flood` as fast as the client can, then, as
          soon as the last POST has returned, one Queue in `fair-lone`: its time to Ready
          and how many of the flood were Ready before it; then --probes - 1 more single
          Queues there, one every --probe-interval seconds, while the flood goes on; and
          the flood's time to all Ready.

A Queue makes a good probe: its pass reads the queue's tags (`ListQueueTags`), which AWS limits
to 5 calls per second per account, so a flood of them fills the operator's pass slots and its
call budget for minutes. Ready is seen through one cluster-wide WATCH of the Queues (the time
an event arrives; no polling), times are the bench's monotonic clock.

    .venv/bin/python bench/fairness.py --n 1000
    .venv/bin/python bench/fairness.py --n 200 --operator-arg=--namespace-max-passes=0

Exit status 0 when every Queue became Ready within --timeout, 1 otherwise, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lib import Failure, log, stop_on_signals  # noqa: E402
from bench.lib.listwatch import ListWatch  # noqa: E402
from bench.lib.measure import operator_pid, proc_status_kib, watching  # noqa: E402
from bench.lib.workload import ready_condition  # noqa: E402
from provisioner import API_VERSION  # noqa: E402
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402
from provisioner_dev.samples import SAMPLES  # noqa: E402

FLOOD, LONE = "fair-flood", "fair-lone"
QUEUES = f"/apis/{API_VERSION}/queues"


class ReadyWatch:
    """The monotonic time each Queue was first seen Ready, from one cluster-wide WATCH."""

    def __init__(self, api: KubeJson) -> None:
        self.ready: dict[tuple[str, str], float] = {}
        self._changed = threading.Condition()
        self.watch = ListWatch(
            api,
            {"queues": QUEUES},
            self._listed,
            self._event,
            thread_name="ready-watch",
            watch_seconds=60,
        )

    @property
    def errors(self) -> list[str]:
        return self.watch.errors

    def start(self) -> None:
        if not self.watch.start().wait_listed(60):
            raise Failure(f"cannot list the Queues: {self.errors[:1]}")

    def stop(self) -> None:
        self.watch.stop(wait=0.0)

    def _listed(self, _: str, items: list[dict[str, Any]], at: float) -> None:
        for item in items:
            self._seen(item)

    def _event(self, _: str, kind: str, obj: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._seen(obj)

    def _seen(self, item: dict[str, Any]) -> None:
        cond = ready_condition(item)
        if cond is None or cond.get("status") != "True":
            return
        meta = item.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        with self._changed:
            if key not in self.ready:
                self.ready[key] = time.monotonic()
                self._changed.notify_all()

    def wait(self, keys: list[tuple[str, str]], timeout: float) -> bool:
        """Whether every one of `keys` was seen Ready within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not all(k in self.ready for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True


def manifest(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**SAMPLES["Queue"].spec, "tags": {"team": "bench"}},
    }


def post(api: KubeJson, namespace: str, name: str) -> float:
    """POST one Queue; returns the monotonic time the request was sent."""
    sent = time.monotonic()
    api.json(
        "POST", f"/apis/{API_VERSION}/namespaces/{namespace}/queues", manifest(namespace, name)
    )
    return sent


def prepare(api: KubeJson) -> None:
    """Untimed: the operator watching Queues, the namespaces, a dry-run create in each (a fresh
    API server holds its first custom-resource create for about 2 s)."""
    deadline = time.monotonic() + 120
    while "queues" not in watching(api):
        if time.monotonic() > deadline:
            raise Failure("the operator is not watching Queues")
        time.sleep(0.2)
    for namespace in (FLOOD, LONE):
        api.json("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        path = f"/apis/{API_VERSION}/namespaces/{namespace}/queues?dryRun=All"
        api.json("POST", path, manifest(namespace, "warm-up"))


def idle_times(api: KubeJson, watch: ReadyWatch, samples: int, timeout: float) -> list[float]:
    """Seconds from the POST to Ready of single Queues on an otherwise idle operator."""
    times = []
    for i in range(samples):
        name = f"idle-{i}"
        sent = post(api, LONE, name)
        if not watch.wait([(LONE, name)], timeout):
            raise Failure(f"the idle Queue {LONE}/{name} was not Ready within {timeout:.0f}s")
        times.append(watch.ready[(LONE, name)] - sent)
    return times


def probes(
    api: KubeJson, watch: ReadyWatch, count: int, interval: float, timeout: float
) -> list[float]:
    """Single Queues in LONE while the flood goes on, the first at once, the others
    `interval` seconds after the one before was POSTed (each waits until the one before is
    Ready): seconds from each POST to Ready."""
    times = []
    for i in range(count):
        name = "lone" if i == 0 else f"probe-{i}"
        sent = post(api, LONE, name)
        if not watch.wait([(LONE, name)], timeout):
            break
        times.append(watch.ready[(LONE, name)] - sent)
        if i + 1 < count:
            time.sleep(max(0.0, sent + interval - time.monotonic()))
    return times


def flood(api: KubeJson, watch: ReadyWatch, opts: argparse.Namespace) -> dict[str, Any]:
    """N Queues in FLOOD, then single ones in LONE: the figures of that phase."""
    names = [f"flood-{i:05d}" for i in range(opts.n)]
    with ThreadPoolExecutor(max_workers=opts.create_workers) as pool:
        sent = list(pool.map(lambda name: post(api, FLOOD, name), names))
    first, posted = min(sent), time.monotonic()
    during = probes(api, watch, opts.probes, opts.probe_interval, opts.timeout)
    lone_ready = watch.ready.get((LONE, "lone"))
    all_ok = watch.wait([(FLOOD, name) for name in names], opts.timeout)
    flood_ready = [watch.ready[(FLOOD, name)] for name in names if (FLOOD, name) in watch.ready]
    return {
        "ok": len(during) == opts.probes and all_ok,
        "flood_post_seconds": round(posted - first, 2),
        "lone_ready_seconds": round(during[0], 3) if during else None,
        "probe_ready_seconds": [round(t, 3) for t in during],
        "flood_ready_before_lone": None
        if lone_ready is None
        else sum(1 for at in flood_ready if at < lone_ready),
        "flood_ready": len(flood_ready),
        "flood_all_ready_seconds": round(max(flood_ready) - first, 1) if all_ok else None,
    }


def report(opts: argparse.Namespace, idle: list[float], loaded: dict[str, Any]) -> dict[str, Any]:
    baseline = statistics.median(idle)
    lone = loaded["lone_ready_seconds"]
    during = loaded["probe_ready_seconds"]
    return {
        "n": opts.n,
        "operator_args": opts.operator_args,
        "idle_ready_seconds": [round(t, 3) for t in idle],
        "idle_ready_median_seconds": round(baseline, 3),
        **loaded,
        "ratio": None if lone is None else round(lone / baseline, 2),
        "probe_median_seconds": round(statistics.median(during), 3) if during else None,
        "probe_median_ratio": round(statistics.median(during) / baseline, 2) if during else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def table(doc: dict[str, Any]) -> str:
    rows = [
        ("flood", f"{doc['n']} Queues in {FLOOD}, POSTed in {doc['flood_post_seconds']} s"),
        (
            "lone Queue to Ready, idle operator",
            f"{doc['idle_ready_median_seconds']} s (median "
            f"of {', '.join(str(t) for t in doc['idle_ready_seconds'])})",
        ),
        ("lone Queue to Ready, during the flood", f"{doc['lone_ready_seconds']} s"),
        ("ratio (target <= 2)", f"{doc['ratio']}x"),
        (
            "single Queues later in the flood",
            ", ".join(f"{t} s" for t in doc["probe_ready_seconds"][1:]) or "(none)",
        ),
        (
            "median of all during the flood, ratio",
            f"{doc['probe_median_seconds']} s, {doc['probe_median_ratio']}x",
        ),
        ("flood Ready before the lone Queue", f"{doc['flood_ready_before_lone']} of {doc['n']}"),
        ("flood time to all Ready", f"{doc['flood_all_ready_seconds']} s"),
        ("operator peak RSS", f"{doc['operator_peak_rss_mb']} MB"),
        ("operator arguments", " ".join(doc["operator_args"]) or "(defaults)"),
        ("load average (1 min) at the end", str(doc["loadavg_1m"])),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/fairness.py", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1000, help="Queues in the flood (default 1000)")
    p.add_argument("--idle-samples", type=int, default=5, help="idle measurements (5)")
    p.add_argument("--create-workers", type=int, default=16, help="POSTs in flight (16)")
    p.add_argument(
        "--probes",
        type=int,
        default=5,
        help="single Queues during the flood, the first at once (5)",
    )
    p.add_argument(
        "--probe-interval", type=float, default=10, help="seconds between two of them (10)"
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds per phase (1800)")
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="ARG",
        help="passed to `provisioner run` (repeatable; --operator-arg=--workers=64)",
    )
    p.add_argument(
        "--package-dir",
        type=Path,
        help="run the operator from the provisioner package under this directory, e.g. an "
        "older commit's (`git archive COMMIT provisioner | tar -x -C DIR`); default: this one",
    )
    p.add_argument("--json", type=Path, dest="json_path", metavar="PATH", help="write figures")
    p.add_argument("--workdir", type=Path, help="logs and data here, kept (default: temp dir)")
    opts = p.parse_args(argv)
    if opts.n < 1 or opts.idle_samples < 1 or opts.probes < 1:
        p.error("--n, --idle-samples and --probes must be >= 1")
    return opts


def measure(opts: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    api = KubeJson(stack.kubeconfig, pool_size=max(32, opts.create_workers))
    watch = ReadyWatch(api)
    prepare(api)
    watch.start()
    try:
        log(f"idle: {opts.idle_samples} single Queues in {LONE}, one at a time")
        idle = idle_times(api, watch, opts.idle_samples, opts.timeout)
        log(f"flood: {opts.n} Queues in {FLOOD}, then one in {LONE}")
        loaded = flood(api, watch, opts)
    finally:
        watch.stop()
    peak = proc_status_kib(operator_pid(stack), "VmHWM")
    loaded["operator_peak_rss_mb"] = None if peak is None else round(peak / 1024, 1)
    return report(opts, idle, loaded)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    stop_on_signals()
    workdir = (opts.workdir or Path(tempfile.mkdtemp(prefix="provisioner-fairness-"))).resolve()
    stack = Stack(dir=workdir)
    code = 1
    try:
        log(f"starting the control plane, moto and the operator in {workdir}")
        stack.start()
        stack.start_operator(
            args=opts.operator_args, cluster_id="bench", package_dir=opts.package_dir
        )
        doc = measure(opts, stack)
        print(table(doc))
        if opts.json_path:
            opts.json_path.write_text(json.dumps(doc, indent=2) + "\n")
        code = 0 if doc["ok"] else 1
        if not doc["ok"]:
            print(f"FAILED: not every Queue was Ready within {opts.timeout:.0f} s")
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        code = 130
    except Exception:  # noqa: BLE001 - reported; the stack is stopped below
        traceback.print_exc()
    finally:
        stack.stop()
        if code == 0 and opts.workdir is None:
            stack.remove()
        else:
            log(f"logs and data kept in {workdir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
