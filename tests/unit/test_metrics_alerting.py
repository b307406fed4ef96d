"""The metrics the alert rules stand on: how long a CR has been not Ready or held in deletion,
the conversion webhook's reviews and certificate, sharding's ownership, the counters exported
as 0 from the start, and `provisioner leaks --metrics-file`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from provisioner import GROUP
from provisioner.runtime import metrics, sharder
from provisioner.runtime.shard_ring import SHARD_LABEL
from provisioner.tools import leaks
from provisioner.webhook import certificates as webhook_certs
from provisioner.webhook import server as webhook

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def stamp(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def samples(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What `collector` exports, by (sample name, sorted labels)."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def ready(status: str, since: float, reason: str = "Available") -> dict[str, str]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "lastTransitionTime": stamp(since),
    }


def test_not_ready_since_is_the_ready_condition_s_last_transition():
    meta = {"creationTimestamp": stamp(T0 - 600)}
    waiting = metrics.recorded("Queue", [ready("False", T0 - 120, "Creating")], meta)
    assert waiting.not_ready_since == T0 - 120 and waiting.deleting_since is None
    assert waiting.conditions == (("Ready", "False", "Creating"),)
    assert metrics.recorded("Queue", [ready("True", T0 - 60)], meta).not_ready_since is None
    # No Ready condition yet: not Ready since its creation.
    assert metrics.recorded("Queue", [], meta).not_ready_since == T0 - 600
    held = metrics.recorded(
        "Queue", [ready("False", T0 - 30, "Deleting")], {**meta, "deletionTimestamp": stamp(T0)}
    )
    assert held.deleting_since == T0
    assert held.not_ready_since is None  # its wait is the deletion's, not a Ready one
    paused = {"type": "Synced", "status": "False", "reason": "Paused"}
    assert metrics.recorded("Queue", [ready("False", T0), paused], meta).not_ready_since is None


def test_the_oldest_not_ready_and_deletion_per_kind_and_zero_for_the_others():
    collector = metrics.ConditionCollector(now=lambda: T0)
    meta = {"creationTimestamp": stamp(T0 - 7200)}
    collector.record("a", metrics.recorded("DatabaseInstance", [ready("False", T0 - 900)], meta))
    collector.record(
        "b", metrics.recorded("DatabaseInstance", [ready("False", T0 - 300)], meta, "prod")
    )
    collector.record("c", metrics.recorded("Queue", [ready("True", T0 - 300)], meta))
    gone = {**meta, "deletionTimestamp": stamp(T0 - 45)}
    collector.record("d", metrics.recorded("S3Bucket", [ready("True", T0 - 300)], gone))
    found = samples(collector)
    oldest = "provisioner_resources_not_ready_oldest_seconds"
    assert found[(oldest, (("kind", "DatabaseInstance"),))] == 900
    assert found[(oldest, (("kind", "Queue"),))] == 0
    assert found[(oldest, (("kind", "Topic"),))] == 0  # a kind with no CR at all: 0, not absent
    deletions = "provisioner_deletions_oldest_seconds"
    assert found[(deletions, (("kind", "S3Bucket"),))] == 45
    assert found[(deletions, (("kind", "DatabaseInstance"),))] == 0
    ready_false = (("condition", "Ready"), ("kind", "DatabaseInstance"))
    by_account = {
        labels[0][1]: value
        for (name, labels), value in found.items()
        if name == "provisioner_resources" and labels[1:3] == ready_false
    }
    assert by_account == {"": 1, "prod": 1}  # one in the operator's own account, one in prod
    collector.forget("a")
    assert samples(collector)[(oldest, (("kind", "DatabaseInstance"),))] == 300


def review(desired: str) -> bytes:
    obj = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "q", "namespace": "ns", "uid": "u"},
        "spec": {"writeConnectionSecretToRef": {"name": "q"}},
    }
    request = {"uid": "r", "desiredAPIVersion": desired, "objects": [obj]}
    return json.dumps(
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request}
    ).encode()


def test_conversion_reviews_are_counted_by_result():
    collector = metrics.WebhookCollector()
    before = samples(collector)
    name = "provisioner_conversion_reviews_total"
    for result in webhook.REVIEW_RESULTS:  # every result exported from the start
        assert (name, (("result", result),)) in before
    assert webhook.answer(review(f"{GROUP}/v1beta1"))[0] == 200
    status, body = webhook.answer(review(f"{GROUP}/v9"))
    assert status == 200 and json.loads(body)["response"]["result"]["status"] == "Failure"
    assert webhook.answer(b"{not json")[0] == 400
    after = samples(collector)
    for result in ("converted", "failed", "malformed"):
        key = (name, (("result", result),))
        assert after[key] == before[key] + 1, result
    assert after[(name, (("result", "too_large"),))] == before[(name, (("result", "too_large"),))]


def test_the_certificate_expiry_is_the_earlier_of_the_certificate_and_its_ca():
    certs = webhook_certs.Certificates(
        b"", b"", b"", b"", not_after="2027-06-01T00:00:00+00:00", ca_not_after=stamp(T0)
    )
    assert webhook._expiry(certs) == T0  # the CA ends first here
    assert webhook._expiry(webhook_certs.Certificates(b"", b"", b"", b"")) is None
    previous = webhook.STATS.certificate_expiry
    try:
        webhook.STATS.certificate_expiry = T0
        found = samples(metrics.WebhookCollector())
        assert found[("provisioner_webhook_certificate_expiry_timestamp_seconds", ())] == T0
        webhook.STATS.certificate_expiry = None  # no webhook served: no series
        found = samples(metrics.WebhookCollector())
        assert ("provisioner_webhook_certificate_expiry_timestamp_seconds", ()) not in found
    finally:
        webhook.STATS.certificate_expiry = previous


class Listing:
    """A Kube stand-in: one page of Queues' metadata, every label patch accepted."""

    def __init__(self, queues: dict[str, str | None]) -> None:
        self.queues, self.patched = queues, 0

    def request(self, method: str, path: str, body: Any = None, **_: object) -> Any:
        if method == "PATCH":
            self.patched += 1
            return {}
        items = [
            {
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "resourceVersion": "1",
                    "labels": {SHARD_LABEL: shard} if shard else {},
                }
            }
            for name, shard in self.queues.items()
        ]
        return {"items": items if path.endswith("/queues") else []}


class Inline:
    def map(self, fn: Any, items: Any) -> Iterator[Any]:
        return map(fn, items)


def test_the_sharder_counts_what_had_no_live_owner_in_its_full_round():
    from provisioner.runtime.sharding import Ring, RingLeases

    kube = Listing({"q1": "a", "q2": "dead", "q3": None, "q4": "b"})
    leases = RingLeases(kube, "ops", "ring", "a", 15)
    shards = sharder.Sharder(leases, Inline())
    shards.leading_until = float("inf")
    alive = frozenset({"a", "b"})
    shards.assign(True, Ring(alive), alive)
    assert shards.unowned == 2  # q2 (a dead member's) and q3 (unlabelled)
    assert kube.patched >= 2
    shards.members = alive
    found = samples(metrics.ShardingCollector(now=lambda: 0.0))
    assert found[("provisioner_sharding_sharder", ())] == 1
    assert found[("provisioner_sharding_members", ())] == 2
    assert found[("provisioner_sharding_unowned_resources", ())] == 2
    shards.leading_until = 0.0  # another replica is the sharder
    found = samples(metrics.ShardingCollector(now=lambda: 1.0))
    assert found[("provisioner_sharding_sharder", ())] == 0
    assert found[("provisioner_sharding_unowned_resources", ())] == 0
    del shards
    import gc

    gc.collect()
    assert not samples(metrics.ShardingCollector())  # sharding off: no series


def test_the_results_exported_at_zero_are_every_result_a_pass_can_have():
    from provisioner.reconciler.outcome import Verdict

    labels = {v.metric_label(requeued) for v in Verdict for requeued in (False, True)}
    assert labels | {"deleted"} == set(metrics.RESULTS)


def test_counters_known_in_advance_start_at_zero():
    metrics.zero_counters()
    text = generate_latest(metrics.REGISTRY).decode()
    found = {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for kind in ("DatabaseInstance", "S3Bucket", "Queue", "Topic"):
        for result in ("success", "error", "requeue"):
            labels = (("kind", kind), ("result", result))
            assert ("provisioner_reconcile_total", labels) in found
    assert ("provisioner_aws_throttles_total", (("service", "rds"),)) in found


def test_leaks_are_written_as_metrics(tmp_path: Path):
    findings = [
        leaks.Finding("leaked", "Queue", "q-1", "owner gone"),
        leaks.Finding("leaked", "Queue", "q-2", "owner gone"),
        leaks.Finding("vanished", "S3Bucket", "b", "no bucket"),
    ]
    path = tmp_path / "leaks.prom"
    leaks.write_metrics(findings, str(path))
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }
    assert found[("provisioner_leaks", (("kind", "Queue"), ("problem", "leaked")))] == 2
    assert found[("provisioner_leaks", (("kind", "S3Bucket"), ("problem", "vanished")))] == 1
    assert found[("provisioner_leaks", (("kind", "Topic"), ("problem", "leaked")))] == 0
    assert found[("provisioner_leaks_last_run_timestamp_seconds", ())] > T0 - 10**9
