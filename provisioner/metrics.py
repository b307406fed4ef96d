"""Prometheus metrics: what a platform team graphs and alerts on.

provisioner_reconcile_total{kind,result}            passes by outcome: success, requeue, error,
                                                    InvalidSpec, NameConflict, Paused, deleted
provisioner_reconcile_duration_seconds{kind}        how long one pass took
provisioner_time_to_ready_seconds{kind}             creation of the CR -> first Ready
provisioner_time_to_delete_seconds{kind}            deletion request -> finalizer released
provisioner_aws_calls_total{service,operation,outcome}
provisioner_resources{kind,condition,status,reason} CRs by their Ready and Synced conditions
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily

from provisioner.cloud.aws import CALLS

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
    "AWS API calls by service, operation and outcome",
    ["service", "operation", "outcome"],
    registry=REGISTRY,
)


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
CALLS.listeners.append(
    lambda service, operation, outcome: AWS_CALLS.labels(service, operation, outcome).inc()
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
