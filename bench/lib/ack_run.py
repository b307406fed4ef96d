"""One controller under bench/ack.py against the stack: N bucket CRs created until every one
is Ready (Synced, for ACK), then all deleted until gone, and what that cost."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.lib import log
from bench.lib.ack_controller import ACK_VERSION
from bench.lib.ack_counts import (
    RssSampler,
    api_writes,
    calls_by_bucket,
    mb,
    read_entries,
    rss_split,
)
from bench.lib.measure import (
    WriteCounts,
    percentile,
    proc_cpu_seconds,
    proc_status_kib,
    rounded,
    scrape_writes,
    write_delta,
)
from bench.lib.recording import BENCH_USER_AGENT, Recording
from provisioner_dev.cloud import DevCloud
from provisioner_dev.kubejson import KubeJson
from provisioner_dev.launch import Stack

ACK_GROUP = "s3.services.k8s.aws"
ACK_NAMESPACE = "ack-bench"
OURS_GROUP = "cloud.provisioner.dev"
OURS_NAMESPACE = "provisioner-bench"
POLL_INTERVAL = 0.5
# A DELETE collection the API server did not finish is asked again after this many seconds.
DELETE_RETRY = 5.0


@dataclass(frozen=True)
class Side:
    """One controller under test: its CRs and what Ready means for them."""

    key: str  # "ack" or "ours"
    label: str
    group: str
    version: str
    kind: str
    plural: str
    namespace: str
    condition: str  # the condition that must be True
    spec: Callable[[int], dict[str, Any]]
    prefix: str  # of the CRs' names

    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/namespaces/{self.namespace}/{self.plural}"

    def manifest(self, i: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": self.kind,
            "metadata": {"name": f"{self.prefix}-{i:05d}", "namespace": self.namespace},
            "spec": self.spec(i),
        }

    def ready(self, item: dict[str, Any]) -> bool:
        for c in (item.get("status") or {}).get("conditions") or []:
            if c.get("type") == self.condition:
                return c.get("status") == "True"
        return False


def ack_side(run_id: str) -> Side:
    return Side(
        key="ack",
        label=f"ACK s3-controller {ACK_VERSION}",
        group=ACK_GROUP,
        version="v1alpha1",
        kind="Bucket",
        plural="buckets",
        namespace=ACK_NAMESPACE,
        condition="ACK.ResourceSynced",
        spec=lambda i: {"name": f"ack-bench-{run_id}-{i:05d}"},
        prefix="ack",
    )


def ours_side() -> Side:
    return Side(
        key="ours",
        label="provisioner",
        group=OURS_GROUP,
        version="v1beta1",
        kind="S3Bucket",
        plural="s3buckets",
        namespace=OURS_NAMESPACE,
        condition="Ready",
        spec=lambda i: {},
        prefix="bucket",
    )


@dataclass
class Creates:
    """One side's create phase: the counters before it, when each CR was sent and first
    seen Ready, and the counters at all Ready and once the controller had settled."""

    writes0: WriteCounts
    mark0: tuple[int, int]
    cpu0: float | None
    load0: float
    rss_before: float  # seconds into the RSS samples
    started: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)
    ready_at: dict[str, float] = field(default_factory=dict)
    create_end: list[float] = field(default_factory=list)
    all_ready: float | None = None
    mark_ready: tuple[int, int] = (0, 0)
    cpu_ready: float | None = None
    rss_at_ready: float = 0.0
    mark1: tuple[int, int] = (0, 0)
    settle_s: float = 0.0
    writes1: WriteCounts = field(default_factory=Counter)


class Run:
    """One side against the stack: prepare, create until all Ready, settle, delete."""

    def __init__(self, side: Side, n: int, stack: Stack, api: KubeJson, opts: Any) -> None:
        self.side = side
        self.n = n
        self.stack = stack
        self.api = api
        self.o = opts
        assert stack.recording is not None
        self.recording = Recording(stack.recording, stack.cloud.log)
        self.cloud = DevCloud(stack.cloud.url, user_agent=BENCH_USER_AGENT)
        self.endpoint_host = urlsplit(stack.cloud.url).hostname or ""
        self.result: dict[str, Any] = {"controller": side.label, "n": n}
        self.errors: list[str] = []
        self.rss: RssSampler | None = None
        self.pid: int | None = None

    def watching(self) -> bool:
        """The controller has a WATCH open on its CRs (the API server's own gauge)."""
        try:
            text = self.api.text("/metrics")
        except RuntimeError:
            return False
        wanted = ('verb="WATCH"', f'group="{self.side.group}"', f'resource="{self.side.plural}"')
        return any(
            line.startswith("apiserver_longrunning_requests{")
            and all(w in line for w in wanted)
            and float(line.rsplit(" ", 1)[1]) > 0
            for line in text.splitlines()
        )

    def prepare(self, pid: int) -> None:
        """Untimed: the controller watching, moto's S3 loaded, the namespace, one dry run."""
        self.pid = pid
        self.rss = RssSampler(pid).start()
        deadline = time.monotonic() + 120
        while not self.watching():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.side.label} is not watching {self.side.plural}")
            time.sleep(0.2)
        self.cloud.client("s3").list_buckets()
        ns = {"metadata": {"name": self.side.namespace}}
        status, data = self.api.request("POST", "/api/v1/namespaces", ns)
        if status not in (201, 409):
            raise RuntimeError(f"namespace {self.side.namespace}: {status} {data[:200]!r}")
        # A fresh API server holds the first create of a kind for about 2 s: a dry run takes
        # that hit and stores nothing.
        self.api.json("POST", f"{self.side.path()}?dryRun=All", self.side.manifest(99999))
        time.sleep(2.0)  # the controller idle, before the first CR

    def run(self, pid: int) -> bool:
        side = self.side
        self.prepare(pid)
        assert self.rss is not None
        before = time.monotonic() - self.rss.t0
        self.result["rss_before_first_cr_mb"] = mb(proc_status_kib(pid, "VmRSS"))
        self.result["rss_split_before_first_cr_mb"] = rss_split(pid)
        self.result["vmhwm_before_first_cr_mb"] = mb(proc_status_kib(pid, "VmHWM"))
        c = Creates(
            writes0=scrape_writes(self.api),
            mark0=self.recording.mark(),
            cpu0=proc_cpu_seconds(pid),
            load0=os.getloadavg()[0],
            rss_before=before,
        )
        log(f"{side.label}: creating {self.n} {side.kind} CRs in {side.namespace}")
        self.create_until_ready(c)
        c.cpu_ready = proc_cpu_seconds(pid)
        c.rss_at_ready = time.monotonic() - self.rss.t0
        split = self.result["rss_split_at_all_ready_mb"] = rss_split(pid)
        self.result["rss_anon_at_all_ready_mb"] = split["RssAnon"]
        self.result["rss_file_at_all_ready_mb"] = split["RssFile"]
        c.mark1, c.settle_s = self.settle()
        c.writes1 = scrape_writes(self.api)
        created = self.n - len(self.errors)
        self.record_ready(c, created)
        ok = c.all_ready is not None
        if not ok:
            self.errors.append(
                f"{len(c.ready_at)}/{created} {side.condition} after {self.o.timeout}s"
            )
        ok = self.delete() and ok
        return ok and not self.errors

    def create_until_ready(self, c: Creates) -> None:
        """POST every CR from a thread pool while a LIST every POLL_INTERVAL notes when each
        was first seen Ready; until all are, or the timeout."""
        side = self.side
        c.started = time.time()

        def post(i: int) -> None:
            body = side.manifest(i)
            name = body["metadata"]["name"]
            c.sent[name] = time.time()
            status, data = self.api.request("POST", side.path(), body)
            if status != 201:
                self.errors.append(f"create {name}: {status} {data[:200]!r}")

        def creator() -> None:
            with ThreadPoolExecutor(self.o.create_workers, thread_name_prefix="create") as pool:
                list(pool.map(post, range(self.n)))
            c.create_end.append(time.time())

        thread = threading.Thread(target=creator, name="creator", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.o.timeout
        c.mark_ready = c.mark0
        while time.monotonic() < deadline:
            tick = time.monotonic()
            now = time.time()
            for item in self.api.list_items(side.path()):
                name = item["metadata"]["name"]
                if name not in c.ready_at and side.ready(item):
                    c.ready_at[name] = now
            if c.create_end and len(c.ready_at) >= self.n - len(self.errors):
                c.all_ready = time.time()
                c.mark_ready = self.recording.mark()
                break
            time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))
        thread.join(timeout=60)

    def record_ready(self, c: Creates, created: int) -> None:
        """The create phase's figures, into `result`."""
        side = self.side
        assert self.rss is not None
        entries = read_entries(self.recording.path, c.mark0[0], c.mark1[0])
        calls = calls_by_bucket(entries, self.recording, self.endpoint_host)
        calls_at_ready = calls_by_bucket(
            read_entries(self.recording.path, c.mark0[0], c.mark_ready[0]),
            self.recording,
            self.endpoint_host,
        )
        codes = self.recording.calls(c.mark0, c.mark1)["moto_status_codes"]
        times = [c.ready_at[k] - c.sent[k] for k in c.ready_at if k in c.sent]
        started, cpu0, cpu_ready = c.started, c.cpu0, c.cpu_ready
        self.result.update(
            {
                "created": created,
                "create_seconds": rounded(c.create_end[0] - started if c.create_end else None, 2),
                "ready": len(c.ready_at),
                "all_ready_seconds": rounded(c.all_ready - started if c.all_ready else None, 2),
                "time_to_ready_p50_s": rounded(percentile(times, 50), 2),
                "time_to_ready_p99_s": rounded(percentile(times, 99), 2),
                "aws_calls_per_bucket": round(calls["total"] / max(1, created), 2),
                "aws_calls_per_bucket_at_all_ready": round(
                    calls_at_ready["total"] / max(1, created), 2
                ),
                "aws_calls": calls,
                "moto_status_codes": codes,
                "settle_seconds": round(c.settle_s, 1),
                "rss_max_create_to_ready_mb": mb(
                    self.rss.max_between(c.rss_before, c.rss_at_ready)
                ),
                "cpu_seconds_create_to_ready": rounded(
                    None if cpu0 is None or cpu_ready is None else cpu_ready - cpu0, 2
                ),
                "api_writes_to_ready": api_writes(
                    write_delta(c.writes0, c.writes1), side.group, side.plural
                ),
                "loadavg_1m": {"create": round(c.load0, 2), "ready": round(os.getloadavg()[0], 2)},
            }
        )
        self.result["api_writes_per_cr_to_ready"] = round(
            self.result["api_writes_to_ready"]["total"] / max(1, created), 2
        )

    def settle(self, quiet: float = 3.0, cap: float = 30.0) -> tuple[tuple[int, int], float]:
        """Wait until moto has recorded no request for `quiet` seconds (at most `cap`)."""
        started = time.monotonic()
        last = self.recording.mark()
        changed = started
        while time.monotonic() - started < cap:
            time.sleep(0.5)
            now = self.recording.mark()
            if now != last:
                last, changed = now, time.monotonic()
            elif time.monotonic() - changed >= quiet:
                break
        return last, time.monotonic() - started

    def delete(self) -> bool:
        side = self.side
        log(f"{side.label}: deleting every {side.kind}")
        mark0 = self.recording.mark()
        started = time.time()
        status, data = self.api.request("DELETE", side.path())
        asked, retries = time.monotonic(), 0
        deadline = time.monotonic() + self.o.timeout
        gone: float | None = None
        remaining = -1
        while time.monotonic() < deadline:
            items = self.api.list_items(side.path())
            remaining = len(items)
            if remaining == 0:
                gone = time.time()
                break
            waiting = any(not item["metadata"].get("deletionTimestamp") for item in items)
            if waiting and time.monotonic() - asked >= DELETE_RETRY:
                # The API server gave up on the collection part-way (a 504 under load, or a
                # success that did not reach every CR): the CRs it had not reached are not
                # being deleted. Ask again for the rest.
                status, data = self.api.request("DELETE", side.path())
                asked, retries = time.monotonic(), retries + 1
            time.sleep(POLL_INTERVAL)
        if status >= 300 and gone is None:
            self.errors.append(f"delete {side.path()}: {status} {data[:200]!r}")
        self.settle(cap=15.0)
        mark1 = self.recording.mark()
        left = [b["Name"] for b in self.cloud.client("s3").list_buckets().get("Buckets") or []]
        deleted_calls = calls_by_bucket(
            read_entries(self.recording.path, mark0[0], mark1[0]),
            self.recording,
            self.endpoint_host,
        )
        self.result.update(
            {
                "all_deleted_seconds": rounded(gone - started if gone else None, 2),
                "delete_collection_retries": retries,
                "crs_left": max(0, remaining),
                "buckets_left_in_moto": len(left),
                "buckets_left_sample": left[:5],
                "aws_calls_per_bucket_to_delete": round(deleted_calls["total"] / max(1, self.n), 2),
                "aws_calls_delete": deleted_calls,
            }
        )
        if gone is None:
            self.errors.append(f"{remaining} {side.kind} CRs still there after {self.o.timeout}s")
        if left:
            self.errors.append(f"{len(left)} buckets left in moto, e.g. {left[:3]}")
            remove_buckets(self.cloud, left)
        return gone is not None and not left

    def finish(self) -> None:
        """VmHWM and the RSS samples, read before the controller is stopped."""
        pid = self.pid
        hwm = proc_status_kib(pid, "VmHWM")
        if self.rss is not None:
            self.rss.stop()
            sampled = max((kib for _, kib in self.rss.samples), default=None)
            self.result["rss_samples"] = len(self.rss.samples)
            self.result["rss_sampled_max_mb"] = mb(sampled)
            self.result["rss_timeline_mb"] = [
                (t, mb(kib)) for t, kib in self.rss.samples[:: max(1, len(self.rss.samples) // 300)]
            ]
        self.result["peak_rss_mb"] = mb(hwm)
        self.result["cpu_seconds_total"] = rounded(proc_cpu_seconds(pid), 2)
        self.result["errors"] = self.errors[:20]
        self.result["ok"] = not self.errors


def remove_buckets(cloud: DevCloud, names: list[str]) -> None:
    """Delete what a controller left in moto (so that the next side starts from nothing)."""
    s3 = cloud.client("s3")
    for name in names:
        try:
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
                for o in (page.get("Versions") or []) + (page.get("DeleteMarkers") or []):
                    s3.delete_object(Bucket=name, Key=o["Key"], VersionId=o["VersionId"])
            s3.delete_bucket(Bucket=name)
        except Exception as exc:  # noqa: BLE001 - reported; moto is stopped at the end anyway
            log(f"could not remove bucket {name}: {exc}")
