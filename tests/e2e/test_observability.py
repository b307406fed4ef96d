"""What a platform team scrapes and reads: Prometheus metrics and structured logs."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from provisioner_dev.processes import free_port
from tests.helpers import apply, manifests, wait_for, wait_gone, wait_ready

pytestmark = pytest.mark.e2e


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def test_metrics_and_json_logs(kube, own_namespace, start_operator):
    port = free_port()
    op = start_operator(args=[f"--metrics-port={port}", "--log-format=json"])
    apply(
        kube,
        own_namespace,
        manifests([("Queue", "metered", "{}"), ("S3Bucket", "metered-b", "{}")]),
    )
    cr = wait_ready(kube, "queue", own_namespace, "metered")
    wait_ready(kube, "s3bucket", own_namespace, "metered-b")

    m = wait_for(
        lambda: (
            (s := scrape(port))
            and sample(s, "provisioner_resources", kind="Queue", condition="Ready", status="True")
            == 1
            and s
        ),
        what="the Ready queue to show in provisioner_resources",
    )
    assert sample(m, "provisioner_reconcile_total", kind="Queue", result="success") >= 1
    assert sample(m, "provisioner_reconcile_duration_seconds_count", kind="S3Bucket") >= 1
    assert sample(m, "provisioner_time_to_ready_seconds_count", kind="Queue") == 1
    assert (
        sample(
            m, "provisioner_aws_calls_total", service="sqs", operation="CreateQueue", outcome="ok"
        )
        == 1
    )
    assert (
        sample(
            m, "provisioner_aws_calls_total", service="s3", operation="CreateBucket", outcome="ok"
        )
        == 1
    )
    assert (
        sample(m, "provisioner_resources", kind="S3Bucket", condition="Synced", status="True") == 1
    )

    kube.kubectl("delete", "queue", "metered", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "queue", own_namespace, "metered")
    m = wait_for(
        lambda: (
            (s := scrape(port))
            and sample(s, "provisioner_time_to_delete_seconds_count", kind="Queue") == 1
            and s
        ),
        what="the deletion to be measured",
    )
    assert sample(m, "provisioner_resources", kind="Queue") == 0

    # Every line is JSON; every line about a CR names its namespace, name and uid.
    lines = [line for line in op.log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    about = [r for r in records if (r.get("object") or {}).get("name") == "metered"]
    assert about, "no log line about the queue"
    for record in about:
        assert record["object"]["namespace"] == own_namespace
        assert record["object"]["uid"] == cr["metadata"]["uid"]
