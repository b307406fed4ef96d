"""Prometheus metrics: what a platform team graphs and alerts on.

provisioner_reconcile_total{kind,result}            passes by outcome: success, requeue, error,
                                                    InvalidSpec, NameConflict, Paused, deleted
provisioner_reconcile_duration_seconds{kind}        how long one pass took
provisioner_time_to_ready_seconds{kind}             creation of the CR -> first Ready
provisioner_time_to_delete_seconds{kind}            deletion request -> finalizer released
provisioner_aws_calls_total{service,operation,outcome}
provisioner_resources{kind,condition,status,reason,account}  CRs by their conditions and account
provisioner_aws_budget_tokens{region,bucket}        tokens left in each AWS call budget bucket
provisioner_aws_budget_rate{region,bucket}          its refill rate now (shrinks on throttling)
provisioner_aws_budget_wait_seconds_total{service}  time calls waited for the budget
provisioner_aws_throttles_total{service}            throttling answers seen from the cloud
provisioner_resync_batches_total{kind}              batched describes made for due resyncs
provisioner_resync_batched_total{kind}              resources those batches described
provisioner_resources_not_ready_oldest_seconds{kind} the longest any CR has been not Ready
provisioner_deletions_oldest_seconds{kind}          the longest any CR's deletion is held
provisioner_conversion_reviews_total{result}        the conversion webhook's reviews by result
provisioner_webhook_certificate_expiry_timestamp_seconds  when its certificate (or CA) expires
provisioner_sharding_sharder                        1 on the replica that is the sharder now
provisioner_sharding_members                        live members the sharder sees
provisioner_sharding_unowned_resources              CRs its last full round found unowned
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from provisioner.aws import budget
from provisioner.aws.session import CALLS
from provisioner.kinds.registry import KINDS
from provisioner.runtime import sharder
from provisioner.webhook import server as webhook

REGISTRY = CollectorRegistry(auto_describe=True)
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)

RECONCILES = PromCounter(
    "provisioner_reconcile",
    "Reconcile passes by kind and result",
    ["kind", "result"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "provisioner_reconcile_duration_seconds",
    "Duration of one reconcile pass",
    ["kind"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
TIME_TO_READY = Histogram(
    "provisioner_time_to_ready_seconds",
    "From the CR's creation to its first Ready=True",
    ["kind"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
TIME_TO_DELETE = Histogram(
    "provisioner_time_to_delete_seconds",
    "From the CR's deletion request to the release of its finalizer",
    ["kind"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
AWS_CALLS = PromCounter(
    "provisioner_aws_calls",
    "AWS API calls by service, operation, outcome and account (empty: the operator's own)",
    ["service", "operation", "outcome", "account"],
    registry=REGISTRY,
)

BUDGET_WAIT = PromCounter(
    "provisioner_aws_budget_wait_seconds",
    "Seconds AWS calls waited for a token of the client-side call budget",
    ["service"],
    registry=REGISTRY,
)
RESYNC_BATCHES = PromCounter(
    "provisioner_resync_batches",
    "Batched describes made for the resources whose resync came due together",
    ["kind"],
    registry=REGISTRY,
)
RESYNC_BATCHED = PromCounter(
    "provisioner_resync_batched",
    "Resources a batched describe observed for their resync (no call of their own)",
    ["kind"],
    registry=REGISTRY,
)
ASSUME_ROLE = PromCounter(
    "provisioner_assume_role",
    "AssumeRole calls into CloudAccounts, by CloudAccount and outcome (ok, error)",
    ["cloudaccount", "outcome"],
    registry=REGISTRY,
)
THROTTLES = PromCounter(
    "provisioner_aws_throttles",
    "Throttling answers from the cloud, by service",
    ["service"],
    registry=REGISTRY,
)


class BudgetCollector:
    """Tokens and refill rate of every bucket of every live call budget."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tokens = GaugeMetricFamily(
            "provisioner_aws_budget_tokens",
            "Tokens left in an AWS call budget bucket (negative: calls queued for tokens)",
            labels=["account", "region", "bucket"],
        )
        rate = GaugeMetricFamily(
            "provisioner_aws_budget_rate",
            "Refill rate of an AWS call budget bucket, tokens per second",
            labels=["account", "region", "bucket"],
        )
        for live in list(budget.ACTIVE):
            for row in live.snapshot():
                labels = [row["account"], row["region"], row["bucket"]]
                tokens.add_metric(labels, row["tokens"])
                rate.add_metric(labels, row["rate"])
        yield tokens
        yield rate


@dataclass(frozen=True)
class Recorded:
    """What the last pass of one CR reported: its conditions, since when it has been not
    Ready (Unix seconds; None: Ready) and since when its deletion is held (None: not deleted)."""

    kind: str
    conditions: tuple[tuple[str, str, str], ...]
    not_ready_since: float | None = None
    deleting_since: float | None = None
    account: str = ""  # its CloudAccount ("": the operator's own)


def recorded(
    kind: str, conditions: list[dict[str, Any]], meta: dict[str, Any], account: str = ""
) -> Recorded:
    """A CR's conditions (as written to its status) and metadata, as the collector keeps them."""
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    deleting_since = epoch(meta.get("deletionTimestamp"))
    not_ready_since = None
    paused = any(c.get("type") == "Synced" and c.get("reason") == "Paused" for c in conditions)
    # A CR being deleted is not Ready by design: its wait is the deletion's, counted apart. A
    # paused one waits for whoever paused it.
    if deleting_since is None and not paused and (ready is None or ready.get("status") != "True"):
        not_ready_since = epoch((ready or {}).get("lastTransitionTime")) or epoch(
            meta.get("creationTimestamp")
        )
    return Recorded(
        kind,
        tuple((c["type"], c["status"], c.get("reason", "")) for c in conditions),
        not_ready_since,
        deleting_since,
        account,
    )


class ConditionCollector:
    """CRs by condition, from what each resource's last pass reported (kept in memory), and
    the oldest not Ready and the oldest deletion held of each kind."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, Recorded] = {}
        self._now = now

    def record(self, uid: str, found: Recorded) -> None:
        with self._lock:
            self._by_uid[uid] = found

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "provisioner_resources",
            "Custom resources by condition type, status and reason, and their CloudAccount",
            labels=["kind", "condition", "status", "reason", "account"],
        )
        not_ready = GaugeMetricFamily(
            "provisioner_resources_not_ready_oldest_seconds",
            "Seconds the CR of this kind that has been not Ready longest has been so (0: none)",
            labels=["kind"],
        )
        deleting = GaugeMetricFamily(
            "provisioner_deletions_oldest_seconds",
            "Seconds since the deletion request of the oldest CR of this kind still held by "
            "its finalizer (0: none)",
            labels=["kind"],
        )
        counts: Counter[tuple[str, str, str, str, str]] = Counter()
        oldest: dict[str, dict[str, float]] = {"ready": {}, "delete": {}}
        with self._lock:
            kinds = {k.kind for k in KINDS} | {r.kind for r in self._by_uid.values()}
            for found in self._by_uid.values():
                for type_, status, reason in found.conditions:
                    counts[(found.kind, type_, status, reason, found.account)] += 1
                for key, since in (
                    ("ready", found.not_ready_since),
                    ("delete", found.deleting_since),
                ):
                    if since is not None:
                        first = oldest[key].get(found.kind, since)
                        oldest[key][found.kind] = min(first, since)
        for labels, value in sorted(counts.items()):
            family.add_metric(list(labels), value)
        now = self._now()
        for kind in sorted(kinds):
            for key, gauge in (("ready", not_ready), ("delete", deleting)):
                since = oldest[key].get(kind)
                gauge.add_metric([kind], max(0.0, now - since) if since is not None else 0.0)
        yield family
        yield not_ready
        yield deleting


class WebhookCollector:
    """The conversion webhook's reviews by result, and when its certificate expires."""

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        reviews = CounterMetricFamily(
            "provisioner_conversion_reviews",
            "ConversionReviews the webhook answered, by result (converted, failed, malformed, "
            "too_large)",
            labels=["result"],
        )
        counts = webhook.STATS.counts()
        for result in sorted({*webhook.REVIEW_RESULTS, *counts}):
            reviews.add_metric([result], counts.get(result, 0))
        yield reviews
        expiry = webhook.STATS.certificate_expiry
        if expiry is not None:
            gauge = GaugeMetricFamily(
                "provisioner_webhook_certificate_expiry_timestamp_seconds",
                "When the first of the webhook's serving certificate and its CA expires",
            )
            gauge.add_metric([], expiry)
            yield gauge


class ShardingCollector:
    """Sharding (on only): whether this replica is the sharder and what it sees."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = list(sharder.ACTIVE)
        if not live:
            return
        now = self._now()
        leading = [s for s in live if s.leading(now)]
        values = {
            "sharder": ("1 on the replica that is the sharder now, 0 on the others", len(leading)),
            "members": (
                "Live members of the ring as the sharder sees them (0 on the others)",
                sum(len(s.members) for s in leading),
            ),
            "unowned_resources": (
                "CRs the sharder's last full round found with no live owner (0 on the others)",
                sum(s.unowned for s in leading),
            ),
        }
        for name, (help_, value) in values.items():
            gauge = GaugeMetricFamily(f"provisioner_sharding_{name}", help_)
            gauge.add_metric([], min(value, 1) if name == "sharder" else value)
            yield gauge


CONDITIONS = ConditionCollector()
REGISTRY.register(CONDITIONS)
REGISTRY.register(BudgetCollector())
REGISTRY.register(WebhookCollector())
REGISTRY.register(ShardingCollector())
budget.LISTENERS.on_wait.append(lambda service, seconds: BUDGET_WAIT.labels(service).inc(seconds))
budget.LISTENERS.on_throttle.append(lambda service: THROTTLES.labels(service).inc())
CALLS.listeners.append(
    lambda service, operation, outcome, account: AWS_CALLS.labels(
        service, operation, outcome, account
    ).inc()
)


def epoch(timestamp: str | None) -> float | None:
    """A Kubernetes timestamp (`2026-01-02T03:04:05Z`) in Unix seconds; None if unreadable."""
    if not timestamp:
        return None
    try:
        return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def seconds_since(timestamp: str | None) -> float | None:
    then = epoch(timestamp)
    return None if then is None else max(0.0, time.time() - then)


# The series of counters that are known before anything happens, exported as 0 from the start:
# a rate over them is 0, not absent, and an alert on them has something to compare.
RESULTS = ("success", "requeue", "error", "InvalidSpec", "NameConflict", "Paused", "deleted")
SERVICES = ("rds", "s3", "sqs", "sns", "iam", "sts")


def zero_counters() -> None:
    for kind in KINDS:
        for result in RESULTS:
            RECONCILES.labels(kind.kind, result)
    for service in SERVICES:
        THROTTLES.labels(service)
        BUDGET_WAIT.labels(service)
    for kind in KINDS:
        for family in (RESYNC_BATCHES, RESYNC_BATCHED, DURATION, TIME_TO_READY, TIME_TO_DELETE):
            family.labels(kind.kind)


def serve(port: int, operator: bool = True) -> None:
    """Serve the metrics on `port`; `operator`: with the operator's counters at 0 from the
    start (False for `provisioner webhook`, which serves only the webhook's)."""
    if operator:
        zero_counters()
    start_http_server(port, addr="0.0.0.0", registry=REGISTRY)
