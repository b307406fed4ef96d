"""The chart's monitoring objects: the ServiceMonitor, the PrometheusRule made from
files/alerts.yaml, and the Grafana dashboards' ConfigMaps, all off by default.

Rendering needs the helm binary; these tests use the cached one and are skipped when it has not
been built, like tests/unit/test_chart_files.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner_dev.binaries import cached_helm
from tests.unit.test_chart_files import CHART, render

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARDS = CHART / "files" / "dashboards"
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def helm() -> Path:
    path = cached_helm()
    if path is None:
        pytest.skip("helm is not built (provisioner_dev.binaries.ensure_helm() builds it)")
    return path


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def dashboards(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in of_kind(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]


def test_nothing_for_monitoring_by_default(helm: Path):
    docs = render(helm)
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert not dashboards(docs)


def test_service_monitor_scrapes_the_metrics_service(helm: Path):
    docs = render(
        helm,
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.labels.release=kube-prometheus",
        "monitoring.serviceMonitor.interval=15s",
    )
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (service,) = [d for d in of_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    assert monitor["metadata"]["namespace"] == "ops"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s"}
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]


def test_service_monitor_needs_the_metrics_port(helm: Path):
    result: Any = render(
        helm, "monitoring.serviceMonitor.enabled=true", "metrics.port=0", check=False
    )
    assert result.returncode != 0
    assert "monitoring.serviceMonitor.enabled needs the metrics port on" in result.stderr


def test_prometheus_rule_is_the_alerts_file_with_the_runbook_address(helm: Path):
    docs = render(
        helm,
        "monitoring.prometheusRule.enabled=true",
        "monitoring.runbookUrl=https://wiki.example.com/provisioner/runbooks",
    )
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    expected = yaml.safe_load(ALERTS.read_text())["groups"]
    for group in expected:
        for alert in group["rules"]:
            alert["annotations"]["runbook_url"] = alert["annotations"]["runbook_url"].replace(
                "docs/runbooks.md", "https://wiki.example.com/provisioner/runbooks"
            )
    assert rule["spec"]["groups"] == expected
    # Without an address of its own, the runbooks are the repository's page.
    (plain,) = of_kind(render(helm, "monitoring.prometheusRule.enabled=true"), "PrometheusRule")
    assert plain["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_dashboards_are_config_maps_for_grafana_s_sidecar(helm: Path):
    docs = render(
        helm, "monitoring.dashboards.enabled=true", "monitoring.dashboards.namespace=grafana"
    )
    maps = dashboards(docs)
    files = sorted(DASHBOARDS.glob("*.json"))
    assert len(maps) == len(files) >= 5
    by_file = {key: value for m in maps for key, value in m["data"].items()}
    for path in files:
        assert json.loads(by_file[path.name]) == json.loads(path.read_text())
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["namespace"] == "grafana"
        assert len(m["metadata"]["name"]) <= 63


def test_dashboard_files_are_grafana_dashboards_with_unique_ids():
    uids = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] not in uids and board["title"].startswith("provisioner / ")
        uids.add(board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", (path.name, panel["title"])
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])


def test_lint_is_clean_with_everything_on(helm: Path):
    import subprocess

    sets = [
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboards.enabled=true",
    ]
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), *(a for s in sets for a in ("--set", s))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout
