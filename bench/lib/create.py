"""The create phase: N CRs from nothing to Ready, followed by a WATCH of each kind."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml

from bench.lib import log
from bench.lib.bound import cloud_bound
from bench.lib.measure import (
    WriteCounts,
    categorize,
    operator_writes,
    parse_time,
    percentile,
    rounded,
    scrape_writes,
    write_delta,
)
from bench.lib.profile import PySpy
from bench.lib.session import Bench
from bench.lib.workload import KINDS, POLL_INTERVAL, Cr, ready_condition
from provisioner import GROUP


def via_api(b: Bench) -> None:
    def post(cr: Cr) -> None:
        cr.sent = time.time()
        status, data = b.api.request("POST", cr.path, cr.manifest())
        cr.returned = time.time()
        if status == 201:
            cr.created_ok = True
        else:
            b.errors.append(f"create {cr.namespace}/{cr.name}: {status} {data[:200]!r}")

    with ThreadPoolExecutor(b.o.create_workers, thread_name_prefix="create") as pool:
        list(pool.map(post, b.crs))


def via_kubectl(b: Bench) -> None:
    kubeconfig = str(b.stack.kubeconfig)
    batches: dict[str, list[Cr]] = defaultdict(list)
    for cr in b.crs:
        batches[cr.namespace].append(cr)

    def run(ns: str) -> None:
        docs = yaml.safe_dump_all([cr.manifest() for cr in batches[ns]])
        sent = time.time()
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", "create", "-f", "-", "-o", "name"],
            input=docs,
            capture_output=True,
            text=True,
            check=False,
        )
        returned = time.time()
        created = set(result.stdout.split())
        for cr in batches[ns]:
            cr.sent, cr.returned = sent, returned
            cr.created_ok = f"{cr.kind.lower()}.{GROUP}/{cr.name}" in created
        if result.returncode != 0:
            b.errors.append(f"kubectl create -n {ns}: {result.stderr.strip()[:300]}")

    with ThreadPoolExecutor(len(batches), thread_name_prefix="kubectl") as pool:
        list(pool.map(run, batches))


def observe(cr: Cr, item: dict[str, Any], start: float, end: float) -> None:
    """What the watched cache says of `cr`: `item` as of `start` (now), a version that
    arrived at `end` (a LIST's send and answer times bound it the same way)."""
    meta = item["metadata"]
    cr.uid = meta.get("uid", cr.uid)
    cr.creation_ts = parse_time(meta.get("creationTimestamp"))
    cr.status = item.get("status") or {}
    cr.resource_version = meta.get("resourceVersion", "")
    cr.last_present = start
    if cr.ready_at is not None:
        return
    ready = ready_condition(item)
    if not ready or ready.get("status") != "True":
        cr.not_ready_at = start
        return
    # The round before showed it not Ready; this version (arrived at `end`) shows it Ready.
    low, high = max(cr.not_ready_at, cr.sent), end
    transition = parse_time(ready.get("lastTransitionTime"))
    if transition is not None:
        low2, high2 = max(low, transition[0]), min(high, transition[1])
        if low2 <= high2:
            low, high = low2, high2
    cr.ready_at = (low + high) / 2
    cr.ready_error = (high - low) / 2
    cr.seen_ready = end


@dataclass
class Marks:
    """Where the counters stood at the phase's moments: before the first create, at all
    Ready, and once the operator had settled."""

    started: float  # wall clock of the first create
    writes0: WriteCounts
    aws0: tuple[int, int]
    create_end: list[float] = field(default_factory=list)
    all_ready_seen: float | None = None
    ready_count: int = 0
    at_ready: WriteCounts = field(default_factory=Counter)
    aws_ready: tuple[int, int] = (0, 0)
    cloud_stats: dict[str, Any] | None = None
    settled: WriteCounts = field(default_factory=Counter)
    settle_seconds: float = 0.0
    quiet: bool = False
    aws1: tuple[int, int] = (0, 0)


def phase(b: Bench) -> bool:
    """Create every CR and poll until all are Ready; False on a timeout."""
    o = b.o
    b.prepare()
    spy = start_spy(b)
    m = Marks(started=0.0, writes0=scrape_writes(b.api), aws0=b.recording.mark())
    b.mark_cpu("create")
    log(f"creating {o.n} CRs in {o.namespaces} namespaces ({o.create_method})")
    m.started = time.time()
    for cr in b.crs:
        cr.not_ready_at = m.started
    done = threading.Event()
    thread = start_creates(b, done, m.create_end)
    deadline = time.monotonic() + o.timeout
    wait_ready(b, done, deadline, m)
    thread.join(timeout=max(0.0, deadline - time.monotonic()))
    b.mark_cpu("ready")
    m.at_ready = scrape_writes(b.api)
    m.aws_ready = b.recording.mark()
    m.cloud_stats = b.stack.awslike.stats() if b.stack.awslike is not None else None
    b.enter("settle")
    if spy:
        spy.stop()
    m.settled, m.settle_seconds, m.quiet = b.settle()
    m.aws1 = b.recording.mark()
    b.mark_cpu("settled")
    record(b, m)
    if m.all_ready_seen is None:
        created = sum(1 for cr in b.crs if cr.created_ok)
        b.timeouts.append(f"ready: {m.ready_count}/{created} Ready after {o.timeout}s")
        return False
    return True


def start_spy(b: Bench) -> PySpy | None:
    """With --py-spy: py-spy attached to the operator, a second before the burst."""
    o = b.o
    if not o.py_spy:
        return None
    assert b.operator_pid
    spy = b.spy = PySpy(b.operator_pid, o.py_spy, o.py_spy_rate, o.py_spy_mode)
    spy.start()
    time.sleep(1.0)  # let it attach before the burst
    return spy


def start_creates(b: Bench, done: threading.Event, create_end: list[float]) -> threading.Thread:
    """Every CR created in a thread of its own; `done` set, and the time in `create_end`,
    when the last create has returned."""
    create = via_api if b.o.create_method == "api" else via_kubectl

    def creator() -> None:
        try:
            create(b)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            b.errors.append(f"create: {exc!r}")
        finally:
            create_end.append(time.time())
            done.set()

    thread = threading.Thread(target=creator, name="creator", daemon=True)
    thread.start()
    return thread


def wait_ready(b: Bench, done: threading.Event, deadline: float, m: Marks) -> None:
    """A round every POLL_INTERVAL until every CR created is Ready, or the deadline."""
    while time.monotonic() < deadline:
        tick = time.monotonic()
        for cr, item, start, end in b.lister.round():
            observe(cr, item, start, end)
        b.sample_rss()
        if done.is_set():
            expected = [cr for cr in b.crs if cr.created_ok]
            m.ready_count = sum(1 for cr in expected if cr.ready_at is not None)
            if m.ready_count == len(expected):
                m.all_ready_seen = time.time()
                break
        time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))


def record(b: Bench, m: Marks) -> None:
    """The phase's figures, into `b.results`."""
    created = [cr for cr in b.crs if cr.created_ok]
    b.results["create"] = create_figures(b, created, m)
    b.results["ready"] = ready_figures(b, created, m)
    if m.cloud_stats is not None and b.stack.awslike is not None:
        config = b.stack.awslike.config()
        b.results["aws_like"] = {
            "profile": config["profile"],
            "time_scale": config["time_scale"],
            "durations_seconds": config["durations_seconds"],
            **cloud_bound(
                m.cloud_stats,
                b.results["ready"]["all_ready_seconds"],
                {
                    k.service: [cr.created_at - m.started for cr in created if cr.kind == k.kind]
                    for k in KINDS
                },
            ),
        }
    n = max(1, len(created))
    writes = categorize(write_delta(m.writes0, m.settled))
    b.results["writes_to_ready"] = {
        **writes,
        "per_cr": {
            k: round(writes[k] / n, 3)
            for k in ("operator_total", "cr", "cr_status", "secret", "event")
        },
        "at_all_ready_operator_total": operator_writes(write_delta(m.writes0, m.at_ready)),
        "settle_seconds": round(m.settle_seconds, 1),
        "settled": m.quiet,
    }
    aws = b.recording.calls(m.aws0, m.aws1)
    b.results["aws_to_ready"] = aws_figures(b, created, aws, m)
    b.results["per_cr"] = [
        {
            "kind": cr.kind,
            "name": f"{cr.namespace}/{cr.name}",
            "created_s": round(cr.created_at - m.started, 3),
            "ready_s": rounded(None if cr.ready_at is None else cr.ready_at - m.started),
            "time_to_ready_s": rounded(cr.time_to_ready),
        }
        for cr in created
    ]
    if b.o.sharding:
        b.results["calls_by_replica_to_ready"] = aws.get("by_app", {})
        b.results["shards_at_ready"] = b.shard_counts()
    b.results["events_by_reason"] = b.events_by_reason()
    b.results["cpu_create_to_ready"] = b.cpu_between("create", "ready")


def create_figures(b: Bench, created: list[Cr], m: Marks) -> dict[str, Any]:
    o, started = b.o, m.started
    latencies = [cr.returned - cr.sent for cr in created]
    return {
        "method": o.create_method,
        "workers": o.create_workers if o.create_method == "api" else len(b.ns_names),
        "created": len(created),
        "create_seconds": rounded(m.create_end[0] - started if m.create_end else None),
        "request_p50_s": rounded(percentile(latencies, 50)),
        "request_max_s": rounded(max(latencies) if latencies else None),
        "first_returned_s": rounded(
            min((cr.returned for cr in created), default=started) - started
        ),
    }


def ready_figures(b: Bench, created: list[Cr], m: Marks) -> dict[str, Any]:
    started = m.started
    ready = [cr for cr in created if cr.ready_at is not None]
    times = [cr.time_to_ready for cr in ready if cr.time_to_ready is not None]
    per_kind: dict[str, Any] = {}
    for k in KINDS:
        kt = [cr.time_to_ready for cr in ready if cr.kind == k.kind and cr.time_to_ready]
        if kt:
            per_kind[k.kind] = {
                "count": len(kt),
                "p50_s": rounded(percentile(kt, 50)),
                "p99_s": rounded(percentile(kt, 99)),
            }
    return {
        "count": len(ready),
        "expected": len(created),
        "all_ready_seconds": rounded(m.all_ready_seen - started if m.all_ready_seen else None),
        "all_ready_estimated_seconds": rounded(
            max(cr.ready_at for cr in ready if cr.ready_at is not None) - started if ready else None
        ),
        "p50_s": rounded(percentile(times, 50)),
        "p90_s": rounded(percentile(times, 90)),
        "p99_s": rounded(percentile(times, 99)),
        "max_s": rounded(max(times) if times else None),
        "mean_ready_time_error_s": rounded(
            sum(cr.ready_error or 0 for cr in ready) / len(ready) if ready else None
        ),
        "per_kind": per_kind,
        "rounds": b.lister.rounds,
        "lists": b.lister.lists,
        "list_seconds_mean": rounded(b.lister.list_seconds / max(1, b.lister.lists)),
        "watch_events": b.lister.events,
        "watch_errors": b.lister.errors[:5],
    }


def aws_figures(b: Bench, created: list[Cr], aws: dict[str, Any], m: Marks) -> dict[str, Any]:
    kind_count = Counter(cr.kind for cr in created)
    service_kind = {k.service: k.kind for k in KINDS}
    return {
        **aws,
        "per_cr": round(aws["operator_total"] / max(1, len(created)), 2),
        "per_cr_by_kind": {
            service_kind[s]: round(c / kind_count[service_kind[s]], 2)
            for s, c in aws["by_service"].items()
            if kind_count.get(service_kind.get(s, ""))
        },
        "at_all_ready_operator_total": b.recording.calls(m.aws0, m.aws_ready)["operator_total"],
    }
