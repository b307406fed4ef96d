"""The phases after the create: idle, restart, spec changes, delete."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from bench.lib import Failure, log
from bench.lib.measure import categorize, percentile, rounded, scrape_writes, write_delta
from bench.lib.session import Bench
from bench.lib.workload import BY_KIND, KINDS, POLL_INTERVAL, Cr

# A DELETE collection the API server did not finish is asked again after this many seconds.
DELETE_RETRY = 5.0


def idle(b: Bench) -> None:
    """--idle seconds of nothing: what is written and called meanwhile."""
    o = b.o
    log(f"idle for {o.idle:.0f}s")
    versions = {cr.key: cr.resource_version for cr in b.crs}
    writes0 = scrape_writes(b.api)
    aws0 = b.recording.mark()
    b.mark_cpu("idle")
    started = time.monotonic()
    while time.monotonic() - started < o.idle:
        b.sample_rss()
        time.sleep(min(POLL_INTERVAL, max(0.0, o.idle - (time.monotonic() - started))))
    writes1 = scrape_writes(b.api)
    aws1 = b.recording.mark()
    b.mark_cpu("idle_end")
    # CRs whose resourceVersion moved while idle (any writer, status or metadata).
    changed = sum(
        1
        for cr, item, _, _ in b.lister.round()
        if item["metadata"].get("resourceVersion") != versions.get(cr.key)
    )
    writes = categorize(write_delta(writes0, writes1))
    calls = b.recording.calls(aws0, aws1)
    kind_count = Counter(cr.kind for cr in b.crs)
    service_kind = {k.service: k.kind for k in KINDS}
    hours = max(o.idle, 1e-9) / 3600
    b.results["idle"] = {
        "seconds": o.idle,
        "writes_total": writes["operator_total"] + writes["other_total"] + writes["cr_client"],
        "writes": writes,
        "crs_changed": changed,
        "aws_calls": calls,
        # The steady state's cost: calls by the kind's service per CR of that kind per hour.
        "aws_per_cr_hour": round(calls["operator_total"] / max(1, len(b.crs)) / hours, 2),
        "aws_per_cr_hour_by_kind": {
            service_kind[s]: round(c / kind_count[service_kind[s]] / hours, 2)
            for s, c in calls["by_service"].items()
            if kind_count.get(service_kind.get(s, ""))
        },
        "leases": b.lease_holders(),
        "cpu": b.cpu_between("idle", "idle_end"),
    }


def restart(b: Bench) -> None:
    """The operator stopped and started again, nothing changed: what the new one calls and
    writes in its first --restart seconds (counted from the start of its process)."""
    o = b.o
    old = b.stack.operator
    assert old is not None
    old.stop()
    ready = sum(1 for cr in b.crs if cr.ready_at is not None)
    log(f"restarting the operator ({ready} CRs Ready); counting for {o.restart:.0f}s")
    writes0 = scrape_writes(b.api)
    aws0 = b.recording.mark()
    b.mark_cpu("restart")
    started = time.monotonic()
    b.stack.start_operator(
        args=o.operator_args,
        cluster_id="bench",
        log=(b.stack.log_dir or b.stack.dir) / "operator-restarted.log",
    )
    up = time.monotonic() - started
    while time.monotonic() - started < o.restart:
        b.sample_rss()
        time.sleep(min(POLL_INTERVAL, max(0.0, o.restart - (time.monotonic() - started))))
    aws1 = b.recording.mark()
    writes1 = scrape_writes(b.api)
    b.mark_cpu("restart_end")
    aws = b.recording.calls(aws0, aws1)
    writes = categorize(write_delta(writes0, writes1))
    n = max(1, ready)
    b.results["restart"] = {
        "seconds": o.restart,
        "crs_ready": ready,
        "operator_up_s": rounded(up),
        "aws_calls": aws,
        "aws_per_cr": round(aws["operator_total"] / n, 3),
        "writes": writes,
        "writes_per_cr": round(writes["operator_total"] / n, 3),
        "cpu": b.cpu_between("restart", "restart_end"),
    }


def changes(b: Bench) -> bool:
    """--changes random Ready CRs get a spec field patched; each is followed in the cloud."""
    o = b.o
    candidates = [cr for cr in b.crs if cr.ready_at is not None and cr.status]
    chosen = random.Random(o.seed + 1).sample(candidates, min(o.changes, len(candidates)))
    log(f"changing {len(chosen)} CRs ({o.change_workers} at a time)")
    writes0 = scrape_writes(b.api)
    aws0 = b.recording.mark()
    b.mark_cpu("changes")
    followed = Changes(b, deadline=time.monotonic() + o.timeout)
    with ThreadPoolExecutor(o.change_workers, thread_name_prefix="change") as pool:
        list(pool.map(followed.change, enumerate(chosen)))
    settled, _, _ = b.settle(cap=15.0)
    aws1 = b.recording.mark()
    b.mark_cpu("changes_end")
    latencies, failures = followed.latencies, followed.failures
    values = [v for v, _ in latencies]
    by_kind = {k.kind: [v for v, cr in latencies if cr.kind == k.kind] for k in KINDS}
    by_kind = {kind: vs for kind, vs in by_kind.items() if vs}
    writes = categorize(write_delta(writes0, settled), client_patches=len(followed.patches))
    b.results["changes"] = {
        "requested": len(chosen),
        "reflected": len(values),
        "workers": o.change_workers,
        "p50_s": rounded(percentile(values, 50)),
        "p99_s": rounded(percentile(values, 99)),
        "max_s": rounded(max(values) if values else None),
        "per_kind_p50_s": {k: rounded(percentile(vs, 50)) for k, vs in by_kind.items()},
        "per_kind_max_s": {k: rounded(max(vs)) for k, vs in by_kind.items()},
        "slowest": [
            f"{cr.kind} {cr.namespace}/{cr.name} {rounded(v)} s"
            for v, cr in sorted(latencies, key=lambda t: t[0], reverse=True)[:5]
        ],
        "failures": failures[:20],
        "writes": writes,
        "aws_calls": b.recording.calls(aws0, aws1),
        "cpu": b.cpu_between("changes", "changes_end"),
    }
    if failures:
        b.timeouts.append(f"changes: {len(failures)} not reflected: {failures[0]}")
        return False
    return True


class Changes:
    """Spec changes made from several threads, each followed in the cloud until it shows."""

    def __init__(self, b: Bench, deadline: float) -> None:
        self.b = b
        self.deadline = deadline
        self.latencies: list[tuple[float, Cr]] = []
        self.failures: list[str] = []
        self.patches: list[str] = []
        self.lock = threading.Lock()

    def change(self, args: tuple[int, Cr]) -> None:
        """PATCH the `i`-th change into `cr`, then check the cloud every 50 ms."""
        i, cr = args
        b = self.b
        try:
            patch, check, what = BY_KIND[cr.kind].change(b.cloud, cr.status, i)
            status, data = b.api.request(
                "PATCH",
                f"{cr.path}/{cr.name}",
                patch,
                content_type="application/merge-patch+json",
            )
            with self.lock:
                self.patches.append(cr.name)
            if status != 200:
                raise Failure(f"PATCH {status} {data[:200]!r}")
            returned = time.monotonic()
            previous = returned
            while time.monotonic() < self.deadline:
                asked = time.monotonic()
                if check():
                    # The cloud changed after the check before this one was sent and
                    # before this one was answered.
                    seen = (previous + time.monotonic()) / 2
                    with self.lock:
                        self.latencies.append((seen - returned, cr))
                    return
                previous = asked
                time.sleep(0.05)
            raise Failure(f"{what} not reflected in the cloud after {b.o.timeout}s")
        except Exception as exc:  # noqa: BLE001 - counted and reported
            with self.lock:
                self.failures.append(f"{cr.kind} {cr.namespace}/{cr.name}: {exc}")


def delete(b: Bench) -> bool:
    """One DELETE collection per namespace and kind, watch until none is left, count leftovers."""
    o = b.o
    present = [cr for cr in b.crs if cr.created_ok]
    log(f"deleting {len(present)} CRs")
    writes0 = scrape_writes(b.api)
    aws0 = b.recording.mark()
    b.mark_cpu("delete")
    started = time.time()
    for cr in present:
        cr.last_present = started
    deletes = Deletes(b)
    deletes.ask(sorted({cr.path for cr in present}))
    all_gone, remaining = wait_gone(b, present, deletes, time.monotonic() + o.timeout)
    b.mark_cpu("deleted")
    if all_gone is None:
        b.errors.extend(
            f"delete {path}: {answer}" for path, answer in sorted(deletes.failed.items())
        )
    writes1 = scrape_writes(b.api)
    aws1 = b.recording.mark()
    left = b.cloud_left()
    secrets_left = b.secrets_left()
    gone_times = [cr.gone_at - started for cr in present if cr.gone_at is not None]
    writes = categorize(write_delta(writes0, writes1))
    n = max(1, len(present))
    aws = b.recording.calls(aws0, aws1)
    b.results["delete"] = {
        "all_gone_seconds": rounded(all_gone - started if all_gone else None),
        "remaining": remaining,
        "delete_collection_retries": deletes.retries,
        "p50_s": rounded(percentile(gone_times, 50)),
        "p99_s": rounded(percentile(gone_times, 99)),
        "writes": writes,
        "writes_per_cr": round(writes["operator_total"] / n, 3),
        "aws_calls": aws,
        "aws_per_cr": round(aws["operator_total"] / n, 2),
        "cpu": b.cpu_between("delete", "deleted"),
    }
    b.results["cloud_resources_left"] = left
    b.results["secrets_left"] = secrets_left
    if all_gone is None:
        b.timeouts.append(f"delete: {remaining} CRs still there after {o.timeout}s")
        return False
    return True


class Deletes:
    """DELETE collection requests, 16 at a time; the collections whose last one failed."""

    def __init__(self, b: Bench) -> None:
        self.b = b
        # Collections whose DELETE failed: path -> the answer.
        self.failed: dict[str, str] = {}
        self.asked = time.monotonic()
        self.retries = 0

    def ask(self, paths: list[str]) -> None:
        with ThreadPoolExecutor(16, thread_name_prefix="delete") as pool:
            list(pool.map(self.delete_all, paths))
        self.asked = time.monotonic()

    def delete_all(self, path: str) -> None:
        status, data = self.b.api.request("DELETE", path)
        if status >= 300:
            self.failed[path] = f"{status} {data[:200]!r}"
        else:
            self.failed.pop(path, None)


def wait_gone(
    b: Bench, present: list[Cr], deletes: Deletes, deadline: float
) -> tuple[float | None, int]:
    """A round every POLL_INTERVAL until no CR is left, or the deadline: (when all were
    gone, or None; how many were left at the last round)."""
    remaining = len(present)
    while time.monotonic() < deadline:
        tick = time.monotonic()
        seen = b.lister.round()
        here = {cr.key for cr, *_ in seen}
        if time.monotonic() - deletes.asked >= DELETE_RETRY:
            # The API server may give up on a collection part-way, with a 504 or without
            # saying so (10,000 CRs on a loaded machine: 58 left, the answer a success): the
            # CRs it had not reached are not being deleted. Ask again for every collection
            # that still holds a CR without a deletionTimestamp (for one already being
            # deleted a DELETE changes nothing).
            left_in = {
                cr.path for cr, item, *_ in seen if not item["metadata"].get("deletionTimestamp")
            }
            again = sorted(left_in)
            deletes.ask(again)
            deletes.retries += len(again)
        for cr, _item, start, _ in seen:
            cr.last_present = start
        for cr in present:
            if cr.gone_at is None and cr.key not in here:
                cr.gone_at = (cr.last_present + time.time()) / 2
        b.sample_rss()
        remaining = len(here)
        if not here:
            return time.time(), remaining
        time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))
    return None, remaining
