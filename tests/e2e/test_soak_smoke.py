"""A short soak inside the suite, so that bench/soak.py cannot rot: with two CloudAccounts,
so that kills, faults and an API-server restart are survived in other accounts too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_own_controlplane

pytestmark = [pytest.mark.e2e, needs_own_controlplane]

ROOT = Path(__file__).resolve().parents[2]


def soak(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """bench/soak.py with `args` (2 namespaces, 30 % AWS faults, 240 s a phase): it must
    pass; its output and figures."""
    figures = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/soak.py"),
            *("--namespaces", "2", "--fault-rate", "0.3", "--timeout", "240"),
            *args,
            *("--json", str(figures)),
        ],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(figures.read_text())


@pytest.mark.timeout(600)
def test_short_soak_has_no_duplicates_leaks_or_stuck_resources(tmp_path):
    result, data = soak(
        tmp_path, "--n", "12", "--kills", "2", "--kill-min", "2", "--kill-max", "4",
        "--invalid", "5", "--accounts", "2",
    )  # fmt: skip
    assert data["kills"] == 2
    assert data["duplicates"] == data["leaks"] == data["stuck terminating"] == 0
    assert data["secrets missing"] == data["missing cloud resources"] == 0
    assert data["in cloud accounts"] == 12  # both namespaces default to a CloudAccount
    assert data["invalid refused"] == data["invalid applied"] == 5
    assert data["aws"]["injected"] > 0
    assert "time taken" in result.stdout


@pytest.mark.timeout(600)
def test_short_sharded_soak_hands_over_without_two_replicas_at_once(tmp_path):
    """Three sharded replicas; each kill is a replica leaving without a word and a new one
    joining. moto's recording (by each replica's user agent) shows, per resource, the
    replicas that called the cloud for it taking turns, none coming back after another."""
    _, data = soak(
        tmp_path, "--n", "16", "--replicas", "3", "--kills", "3", "--kill-min", "3",
        "--kill-max", "6", "--invalid", "4",
    )  # fmt: skip
    assert data["kills"] == 3
    assert data["duplicates"] == data["leaks"] == data["stuck terminating"] == 0
    assert data["secrets missing"] == data["missing cloud resources"] == 0
    assert data["acted on by two at once"] == 0
    assert data["handovers"] > 0
