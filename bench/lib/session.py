"""The benchmark against a running stack: its CRs and watches, sampling, prepare, finish.

`Bench` is what every phase works on (bench/lib/create.py, bench/lib/phases.py); the phases in
order are bench/lib/run.py's.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from bench.lib import Failure
from bench.lib.measure import (
    WriteCounts,
    cpu_snapshot,
    operator_pid,
    operator_writes,
    proc_status_kib,
    rounded,
    scrape_writes,
    watching,
)
from bench.lib.options import Options
from bench.lib.profile import PySpy
from bench.lib.recording import BENCH_USER_AGENT, Recording
from bench.lib.synced import SyncedWatch
from bench.lib.workload import KINDS, PLURALS, Lister, plan
from provisioner import ACCOUNTS_API_VERSION, API_VERSION, GROUP
from provisioner_dev.cloud import DevCloud, cloud_account, create_role, in_account, inventory
from provisioner_dev.kubejson import KubeJson
from provisioner_dev.launch import Stack

HASH_ANNOTATION = f"{GROUP}/content-hash"


class Bench:
    def __init__(self, opts: Options, stack: Stack, api: KubeJson) -> None:
        self.o = opts
        self.stack = stack
        self.api = api
        assert stack.recording is not None, "the bench counts AWS calls in moto's recording"
        self.recording = Recording(stack.recording, stack.cloud.log)
        self.ns_names = [f"bench-{i:02d}" for i in range(opts.namespaces)]
        self.crs = plan(opts.n, opts.mix, self.ns_names, opts.seed)
        self.lister = Lister(api, self.crs)
        self.results: dict[str, Any] = {}
        self.timeouts: list[str] = []
        self.errors: list[str] = []
        self.rss_max_kib = 0
        self.spy: PySpy | None = None
        self.cpu_marks: dict[str, dict[str, float]] = {}
        # The bench's own checks go to moto directly: never throttled, never delayed, and
        # no draw on the operator's buckets.
        self.cloud = DevCloud(stack.cloud.url, user_agent=BENCH_USER_AGENT)
        # With --accounts: the accounts' ids, and the bench's view of each.
        self.account_ids = [f"{100000000001 + i}" for i in range(opts.accounts)]
        self.account_clouds: list[DevCloud] = []
        # With the aws-like cloud: every Synced=False the CRs show, phase by phase.
        self.synced: SyncedWatch | None = None
        if stack.awslike is not None:
            names = {(cr.namespace, cr.name) for cr in self.crs}
            self.synced = SyncedWatch(
                KubeJson(stack.kubeconfig, pool_size=8),
                sorted({cr.plural for cr in self.crs}),
                wanted=lambda namespace, name: (namespace, name) in names,
            )

    def enter(self, phase: str) -> None:
        """The phase the Synced=False seen from now on belong to."""
        if self.synced is not None:
            self.synced.phase = phase

    @property
    def operator_pid(self) -> int | None:
        return operator_pid(self.stack)

    # -- sampling --------------------------------------------------------------------------

    def sample_rss(self) -> None:
        rss = proc_status_kib(self.operator_pid, "VmRSS")
        if rss:
            self.rss_max_kib = max(self.rss_max_kib, rss)

    def mark_cpu(self, name: str) -> None:
        self.cpu_marks[name] = cpu_snapshot(self.stack)
        # The machine may be shared: the 1-minute load average at each phase boundary.
        self.results.setdefault("loadavg_1m", {})[name] = round(os.getloadavg()[0], 2)

    def cpu_between(self, a: str, b: str) -> dict[str, float]:
        start, end = self.cpu_marks.get(a, {}), self.cpu_marks.get(b, {})
        return {k: round(end[k] - start[k], 2) for k in end if k in start}

    def settle(self, quiet: float = 3.0, cap: float = 30.0) -> tuple[WriteCounts, float, bool]:
        """Wait until the operator has made no API write for `quiet` seconds (at most `cap`)."""
        started = time.monotonic()
        last = scrape_writes(self.api)
        last_value, last_change = operator_writes(last), time.monotonic()
        while time.monotonic() - started < cap:
            time.sleep(0.5)
            self.sample_rss()
            current = scrape_writes(self.api)
            value = operator_writes(current)
            if value != last_value:
                last_value, last_change = value, time.monotonic()
            last = current
            if time.monotonic() - last_change >= quiet:
                return last, time.monotonic() - started, True
        return last, time.monotonic() - started, False

    # -- before and after ------------------------------------------------------------------

    def prepare(self) -> None:
        """Untimed: the operator watching every kind, moto's services loaded, namespaces."""
        started = time.monotonic()
        deadline = started + 120
        while watching(self.api) < PLURALS:
            if time.monotonic() > deadline:
                raise Failure(f"the operator is not watching {PLURALS - watching(self.api)}")
            time.sleep(0.2)
        self.results["operator_watching_after_s"] = round(time.monotonic() - started, 2)
        try:  # after the operator's WATCHes were counted: the bench's own count as WATCHes too
            self.lister.start()
        except RuntimeError as exc:
            raise Failure(str(exc)) from None
        # moto imports a service's backend on its first request (RDS: about 1 s).
        inventory(self.cloud)
        self.create_accounts()
        self.create_namespaces()
        if self.stack.awslike is not None:
            # Counted from the first create on: the operator made no call before it.
            self.stack.awslike.reset()
        if self.synced is not None:
            self.enter("create")
            if not self.synced.start().wait_listed():
                raise Failure(f"cannot watch the CRs: {self.synced.errors[:1]}")

    def create_namespaces(self) -> None:
        """The namespaces, then a dry-run create of each kind in each of them (untimed).

        A fresh kube-apiserver holds the first create of a custom resource for about 2 s
        (once per process); a dry run takes that hit, stores nothing and is not seen by the
        operator, so the timed creates measure a warm API server, as in a real cluster.
        """
        started = time.monotonic()
        for j, ns in enumerate(self.ns_names):
            meta: dict[str, Any] = {"name": ns}
            if self.account_ids:
                i = j % len(self.account_ids)
                meta["labels"] = {"bench-account": f"acc-{i}"}
                meta["annotations"] = {f"{GROUP}/default-account": f"bench-acc-{i}"}
            self.api.json("POST", "/api/v1/namespaces", {"metadata": meta})
        for ns in self.ns_names:
            for kind in sorted({cr.kind for cr in self.crs}):
                cr = next(c for c in self.crs if c.kind == kind)
                body = {**cr.manifest(), "metadata": {"name": "warm-up", "namespace": ns}}
                path = f"/apis/{API_VERSION}/namespaces/{ns}/{cr.plural}?dryRun=All"
                self.api.json("POST", path, body)
        self.results["warm_up_seconds"] = round(time.monotonic() - started, 2)

    def create_accounts(self) -> None:
        """With --accounts: a role in each account (in moto's IAM there) and a CloudAccount
        selecting every --accounts-th namespace, which names it as its default."""
        for i, account in enumerate(self.account_ids):
            url = self.stack.cloud.url
            role = create_role(url, account, "provisioner", user_agent=BENCH_USER_AGENT)
            self.account_clouds.append(
                in_account(url, account, "bench", user_agent=BENCH_USER_AGENT)
            )
            body = cloud_account(f"bench-acc-{i}", role, {"bench-account": f"acc-{i}"})
            self.api.json("POST", f"/apis/{ACCOUNTS_API_VERSION}/cloudaccounts", body)

    def events_by_reason(self) -> dict[str, int]:
        """Events in the bench namespaces by `component: type reason` (who posted what)."""
        found: Counter[str] = Counter()
        for item in self.api.list_items("/api/v1/events"):
            if item["metadata"]["namespace"] not in self.ns_names:
                continue
            component = (item.get("source") or {}).get("component") or item.get(
                "reportingComponent", "?"
            )
            found[f"{component}: {item.get('type')} {item.get('reason')}"] += int(
                item.get("count") or 1
            )
        return dict(found.most_common())

    def lease_holders(self) -> list[dict[str, str]]:
        """Who holds (and so renews) each Lease: names the component behind `leases` writes."""
        try:
            items = self.api.list_items("/apis/coordination.k8s.io/v1/leases")
        except RuntimeError:
            return []
        return [
            {
                "lease": f"{i['metadata']['namespace']}/{i['metadata']['name']}",
                "holder": (i.get("spec") or {}).get("holderIdentity", ""),
                "renewTime": (i.get("spec") or {}).get("renewTime", ""),
                "manager": ",".join(
                    sorted({m.get("manager", "") for m in i["metadata"].get("managedFields", [])})
                ),
            }
            for i in items
        ]

    def shard_counts(self) -> dict[str, int]:
        """The bench's CRs by the shard label the sharder gave them."""
        found: Counter[str] = Counter()
        for plural in sorted({cr.plural for cr in self.crs}):
            for item in self.api.list_items(f"/apis/{API_VERSION}/{plural}"):
                labels = item["metadata"].get("labels") or {}
                found[labels.get(f"sharding.{GROUP}/shard", "")] += 1
        return dict(sorted(found.items()))

    def replica_figures(self) -> list[dict[str, Any]]:
        """Per sharded replica: its resources at the end of the create phase (the shard
        label), its AWS calls to Ready (moto's recording, by user agent), peak RSS, CPU."""
        pids = {p: pid for p, pid in self.stack.pids().items() if p.startswith("operator")}
        rows = []
        for i, (name, pid) in enumerate(sorted(pids.items(), key=lambda kv: kv[1])):
            shard = f"r{i}"
            rows.append(
                {
                    "shard": shard,
                    "crs": self.results.get("shards_at_ready", {}).get(shard, 0),
                    "aws_calls_to_ready": self.results.get("calls_by_replica_to_ready", {}).get(
                        shard, 0
                    ),
                    "peak_rss_mb": rounded((proc_status_kib(pid, "VmHWM") or 0) / 1024, 1),
                    "cpu_seconds": rounded(self.cpu_marks["end"].get(name), 2),
                }
            )
        return rows

    def cloud_left(self) -> dict[str, int]:
        by_kind = Counter(r.kind for c in [self.cloud, *self.account_clouds] for r in inventory(c))
        snapshots = 0
        for page in self.cloud.client("rds").get_paginator("describe_db_snapshots").paginate():
            snapshots += len(page.get("DBSnapshots") or [])
        return {
            "total": sum(by_kind.values()),
            **{k.left_key: by_kind[k.kind] for k in KINDS},
            # Final snapshots of deletionPolicy Snapshot (the DatabaseInstance default) are
            # kept by design; not counted as leaks.
            "db_snapshots_by_policy": snapshots,
        }

    def secrets_left(self) -> int:
        count = 0
        for item in self.api.list_items("/api/v1/secrets"):
            meta = item["metadata"]
            if meta["namespace"] in self.ns_names and HASH_ANNOTATION in (
                meta.get("annotations") or {}
            ):
                count += 1
        return count

    def finish(self) -> None:
        pid = self.operator_pid
        self.sample_rss()
        hwm = proc_status_kib(pid, "VmHWM")
        self.mark_cpu("end")
        self.results["operator"] = {
            "pid": pid,
            "peak_rss_mb": rounded((hwm or self.rss_max_kib) / 1024, 1),
            "vmhwm_kib": hwm,
            "sampled_max_rss_kib": self.rss_max_kib,
            "cpu_seconds": rounded(self.cpu_marks["end"].get("operator"), 2),
        }
        if self.o.sharding:
            self.results["replicas"] = self.replica_figures()
        self.results["cpu_seconds_total"] = {
            k: round(v, 2) for k, v in self.cpu_marks["end"].items()
        }
