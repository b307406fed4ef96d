"""Prometheus metrics: what a platform team graphs and alerts on.

provisioner_reconcile_total{kind,result}            passes by outcome: success, requeue, error,
                                                    InvalidSpec, NameConflict, Paused, deleted
provisioner_reconcile_duration_seconds{kind}        how long one pass took
provisioner_time_to_ready_seconds{kind}             creation of the CR -> first Ready
provisioner_time_to_delete_seconds{kind}            deletion request -> finalizer released
provisioner_aws_calls_total{service,operation,outcome}
provisioner_resources{kind,condition,status,reason} CRs by their Ready and Synced conditions
provisioner_aws_budget_tokens{region,bucket}        tokens left in each AWS call budget bucket
provisioner_aws_budget_rate{region,bucket}          its refill rate now (shrinks on throttling)
provisioner_aws_budget_wait_seconds_total{service}  time calls waited for the budget
provisioner_aws_throttles_total{service}            throttling answers seen from the cloud
provisioner_resync_batches_total{kind}              batched describes made for due resyncs
provisioner_resync_batched_total{kind}              resources those batches described
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily

from provisioner.aws import budget
from provisioner.aws.session import CALLS

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


class ConditionCollector:
    """CRs by condition, from what each resource's last pass reported (kept in memory)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {}

    def record(self, uid: str, kind: str, conditions: list[tuple[str, str, str]]) -> None:
        with self._lock:
            self._by_uid[uid] = (kind, tuple(conditions))

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "provisioner_resources",
            "Custom resources by condition type, status and reason",
            labels=["kind", "condition", "status", "reason"],
        )
        counts: Counter[tuple[str, str, str, str]] = Counter()
        with self._lock:
            for kind, conditions in self._by_uid.values():
                for type_, status, reason in conditions:
                    counts[(kind, type_, status, reason)] += 1
        for labels, value in sorted(counts.items()):
            family.add_metric(list(labels), value)
        yield family


CONDITIONS = ConditionCollector()
REGISTRY.register(CONDITIONS)
REGISTRY.register(BudgetCollector())
budget.LISTENERS.on_wait.append(lambda service, seconds: BUDGET_WAIT.labels(service).inc(seconds))
budget.LISTENERS.on_throttle.append(lambda service: THROTTLES.labels(service).inc())
CALLS.listeners.append(
    lambda service, operation, outcome, account: AWS_CALLS.labels(
        service, operation, outcome, account
    ).inc()
)


def seconds_since(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


def serve(port: int) -> None:
    start_http_server(port, addr="0.0.0.0", registry=REGISTRY)
