"""Every panel of the chart's Grafana dashboards against a real Prometheus scraping a real
operator: each query parses and returns at least one series, or is named below with the
reason it has none in this demo.

Prometheus is built from hack/prometheus (provisioner_dev/prometheus.py, cached); the test is
skipped, saying why, only when it cannot be built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner_dev.binaries import BuildError
from provisioner_dev.processes import free_port
from provisioner_dev.prometheus import PrometheusServer, QueryError, ensure_prometheus
from tests.helpers import apply, manifests, wait_condition, wait_for, wait_gone, wait_ready

pytestmark = pytest.mark.e2e

CHART_FILES = Path(__file__).resolve().parents[2] / "deploy/helm/provisioner/files"
DASHBOARDS = CHART_FILES / "dashboards"
# Grafana's variables, as "All" and a rate window covering the whole test give them.
VARIABLES = {"$namespace": ".*", "$account": ".*", "$__rate_interval": "10m"}
# Panels with no series in this demo, by (dashboard file, panel title), and why.
NO_DATA_IN_DEMO = {
    ("aws.json", "AssumeRole into CloudAccounts"): "the demo has no CloudAccount",
}


def panels() -> Iterator[tuple[str, str, str]]:
    """(dashboard file, panel title, expression) of every target of every panel."""
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                yield path.name, panel["title"], target["expr"]


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    left = re.findall(r"\$\w+", expr)
    assert not left, f"a variable the test does not set: {left} in {expr}"
    return expr


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    try:
        return ensure_prometheus()["prometheus"]
    except BuildError as exc:
        pytest.skip(f"Prometheus cannot be built from hack/prometheus: {exc}")


def test_every_dashboard_panel_returns_series(
    kube, aws, own_namespace, start_operator, prometheus_binary, tmp_path
):
    port = free_port()
    start_operator(
        args=[f"--metrics-port={port}", "--sharding=on", "--shard-name=dash"],
        env={"PROVISIONER_NAMESPACE": own_namespace, "PROVISIONER_SHARD_RING": own_namespace},
    )
    # The tests' operators leave the conversion webhook to `provisioner webhook`, a process of
    # its own with a metrics port of its own.
    webhook = kube.stack.webhook
    assert webhook is not None and webhook.metrics_port
    prometheus = PrometheusServer(
        binary=prometheus_binary,
        targets={
            "provisioner": [f"127.0.0.1:{port}"],
            "provisioner-webhook": [f"127.0.0.1:{webhook.metrics_port}"],
        },
        rule_files=[CHART_FILES / "alerts.yaml"],
        log=tmp_path / "prometheus.log",
    )
    prometheus.start(timeout=120)
    try:
        prometheus.wait_for_scrape("provisioner", timeout=120)
        prometheus.wait_for_scrape("provisioner-webhook", timeout=120)
        _make_series(kube, aws, own_namespace)
        # Two scrapes after the last change: every rate() has its two samples.
        prometheus.wait_for_scrape("provisioner", timeout=120, scrapes=2)
        wait_for(
            lambda: prometheus.query('provisioner_time_to_delete_seconds_count{kind="Queue"} > 0'),
            timeout=120,
            what="the deletion to be scraped",
        )
        prometheus.wait_for_scrape("provisioner", timeout=120, scrapes=2)
        empty, checked = [], 0
        for dashboard, title, expr in panels():
            try:
                series = prometheus.query(substituted(expr))
            except QueryError as exc:
                pytest.fail(f"{dashboard} / {title}: {expr} is refused: {exc}")
            checked += 1
            reason = NO_DATA_IN_DEMO.get((dashboard, title))
            if reason is None and not series:
                empty.append(f"{dashboard} / {title}: {expr}")
            if reason is not None and series:
                empty.append(f"{dashboard} / {title} has data now: drop it from NO_DATA_IN_DEMO")
        assert not empty, "panels without series:\n" + "\n".join(empty)
        assert checked >= 25
        _check_values(prometheus)
        _check_alerts(prometheus)
    finally:
        prometheus.stop()


def _check_values(prometheus: PrometheusServer) -> None:
    """What the metrics behind the panels say of the resources made by _make_series."""

    def value(expr: str) -> float | None:
        series = prometheus.query(expr)
        return float(series[0]["value"][1]) if series else None

    ready = 'sum by (status) (provisioner_resources{{condition="Ready", status="{}"}})'
    assert value(ready.format("True")) == 3  # dash-q, dash-b, dash-t
    assert value(ready.format("False")) == 2  # dash-waits and dash-conflict
    assert (value('max(provisioner_resources_not_ready_oldest_seconds{kind="Queue"})') or 0) > 0
    assert value('max(provisioner_resources_not_ready_oldest_seconds{kind="S3Bucket"})') == 0
    assert (
        value('max(provisioner_deletions_oldest_seconds{kind="Queue"})') == 0
    )  # dash-gone is gone
    assert value("provisioner_sharding_sharder") == 1 and value("provisioner_sharding_members") == 1
    # The webhook's certificate: valid for about a year (renewed 30 days ahead), its CA longer.
    expires_in = value("provisioner_webhook_certificate_expiry_timestamp_seconds - time()") or 0
    assert 30 * 86400 < expires_in <= 366 * 86400
    # Its full rounds (every 30 s) see every resource owned once those made here are labelled.
    wait_for(
        lambda: value("provisioner_sharding_unowned_resources") == 0,
        timeout=120,
        what="the sharder to find no resource without an owner",
    )


def _check_alerts(prometheus: PrometheusServer) -> None:
    """The chart's alert rules, evaluated every second against the same series: every one
    evaluates without an error, and those about a healthy operator stay inactive."""

    def evaluated() -> list[dict] | None:
        rules = prometheus.rules()
        done = all(r.get("lastEvaluation", "").startswith("2") for r in rules)
        return rules if rules and done else None

    rules = wait_for(evaluated, timeout=60, what="every alert rule to be evaluated")
    assert len(rules) >= 14
    failing = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert not failing, failing
    state = {r["name"]: r["state"] for r in rules}
    for healthy in ("ProvisionerDown", "ProvisionerNoSharder", "ProvisionerNotReconciling"):
        assert state[healthy] == "inactive", (healthy, state)


def _make_series(kube, aws, namespace: str) -> None:
    """One resource of each kind Ready, a Queue waiting on a dead-letter Queue that does not
    exist (not Ready), one whose name an untagged queue holds (not Synced: NameConflict), and
    a Queue deleted (time to delete)."""
    taken = f"{namespace}-taken"
    aws.sqs.create_queue(QueueName=taken)
    apply(
        kube,
        namespace,
        manifests(
            [
                ("Queue", "dash-q", "{}"),
                ("Queue", "dash-gone", "{}"),
                ("S3Bucket", "dash-b", "{}"),
                ("Topic", "dash-t", "{}"),
                ("Queue", "dash-waits", "{deadLetter: {queueRef: {name: dash-missing}}}"),
                ("Queue", "dash-conflict", f"{{queueName: {taken}}}"),
            ]
        ),
    )
    for kind, name in (("queue", "dash-q"), ("queue", "dash-gone"), ("s3bucket", "dash-b")):
        wait_ready(kube, kind, namespace, name, timeout=120)
    wait_ready(kube, "topic", namespace, "dash-t", timeout=120)
    wait_condition(
        kube, "queue", namespace, "dash-waits", "Ready", "False", "WaitingForDependency", 120
    )
    wait_condition(
        kube, "queue", namespace, "dash-conflict", "Synced", "False", "NameConflict", 120
    )
    kube.kubectl("delete", "queue", "dash-gone", "-n", namespace, "--wait=false")
    wait_gone(kube, "queue", namespace, "dash-gone", timeout=120)
