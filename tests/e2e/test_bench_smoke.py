"""bench/converge.py still runs end to end (a tiny N, so that the script does not rot).

It starts its own control plane, moto and operator, so it uses none of the session fixtures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_own_controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), needs_own_controlplane]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_converge_smoke(tmp_path):
    report = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "converge.py"),
            "--n",
            "9",
            "--namespaces",
            "3",
            "--idle",
            "2",
            "--restart",
            "3",
            "--changes",
            "3",
            "--timeout",
            "120",
            "--json",
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, output
    for row in ("time to all Ready", "cloud resources left", "operator peak RSS"):
        assert row in result.stdout, output
    figures = json.loads(report.read_text())
    assert figures["ok"] is True
    assert figures["cloud_resources_left"] == 0
    assert figures["details"]["ready"]["count"] == 9
    assert figures["details"]["ready"]["expected"] == 9
    assert figures["details"]["changes"]["reflected"] == 3
    assert figures["details"]["restart"]["crs_ready"] == 9


def test_bench_converge_smoke_aws_like(tmp_path):
    """One CR of each kind through the aws-like proxy, its durations scaled down 300 times."""
    report = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "converge.py"),
            "--cloud-profile",
            "aws-like",
            "--time-scale",
            "300",
            "--n",
            "4",
            "--namespaces",
            "1",
            "--idle",
            "1",
            "--changes",
            "0",
            "--timeout",
            "60",
            "--json",
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, output
    for row in ("Synced=False seen", "bound set by the cloud", "time to all Ready / bound"):
        assert row in result.stdout, output
    assert "< 60 s" not in result.stdout  # the instant cloud's targets are not applied
    figures = json.loads(report.read_text())
    assert figures["cloud_resources_left"] == 0
    assert figures["details"]["ready"]["count"] == 4
    aws = figures["details"]["aws_like"]
    assert aws["time_scale"] == 300
    # Every kind's calls went through the proxy, none of the bench's own.
    assert set(aws["calls_by_service"]) >= {"rds", "s3", "sqs", "sns"}
    assert aws["buckets"]["rds.*CreateDBInstance"]["calls"] == 1
    assert aws["durations_drawn"]["rds.create"]["count"] == 1
    assert 0 < aws["bound_s"] <= aws["all_ready_s"]
    synced = figures["details"]["synced_false"]
    assert synced["throttling"] == 0 and synced["watch_events"] > 0


def test_bench_access_smoke():
    """bench/access.py: a steady pass costs two IAM reads per grant, and nothing is left."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "access.py"), "--grants", "3"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert lines["steady"].split()[2] == "2.00", result.stdout
    assert "CreateRole 1" in lines["made"] and "DeleteRole 1" in lines["revoked"], result.stdout
