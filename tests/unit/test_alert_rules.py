"""The alert rules (deploy/helm/provisioner/files/alerts.yaml): `promtool check rules`, the
`promtool test rules` cases of tests/promtool/alerts_test.yaml, a case where each alert fires
and one where it does not, and a runbook section for each.

promtool is built from hack/prometheus (provisioner_dev/prometheus.py, once per machine); the
promtool tests are skipped, saying why, only when it cannot be built.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner_dev.binaries import BuildError
from provisioner_dev.prometheus import ensure_promtool, promtool

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "helm" / "provisioner" / "files" / "alerts.yaml"
CASES = ROOT / "tests" / "promtool" / "alerts_test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@pytest.fixture(scope="module")
def built_promtool() -> Path:
    try:
        return ensure_promtool()
    except BuildError as exc:
        pytest.skip(f"promtool cannot be built from hack/prometheus: {exc}")


def test_promtool_checks_the_rules(built_promtool):
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_rule_tests_pass(built_promtool):
    result = promtool("test", "rules", str(CASES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_broken_expectation_fails_promtool(built_promtool, tmp_path):
    """The cases can fail: the same file with one expected alert dropped does."""
    cases = yaml.safe_load(CASES.read_text())
    cases["rule_files"] = [str(ALERTS)]
    firing = next(
        check
        for test in cases["tests"]
        for check in test["alert_rule_test"]
        if check.get("exp_alerts")
    )
    firing["exp_alerts"] = []
    broken = tmp_path / "broken_test.yaml"
    broken.write_text(yaml.safe_dump(cases))
    result = promtool("test", "rules", str(broken))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in yaml.safe_load(CASES.read_text())["tests"]:
        for check in test["alert_rule_test"]:
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "alerts no case sees firing"
    assert names - quiet == set(), "alerts no case sees quiet"
    assert fires | quiet <= names, "cases of alerts that do not exist"


def anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_alert_has_its_runbook_section_and_severity():
    sections = anchors(RUNBOOKS.read_text())
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks.md", url
        assert anchor == rule["alert"].lower() and anchor in sections, url
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
