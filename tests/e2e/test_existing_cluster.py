"""PROVISIONER_TEST_KUBECONFIG: the suite runs against a cluster the developer already has.

A bare control plane stands in for their kind, k3d or dev EKS cluster. A few of the suite's own
tests are run against it in a second pytest: the end-to-end ones pass there, the ones that
need a control plane of their own are skipped with the reason, the cluster's processes are the
same afterwards (nothing restarted it), and what the run added besides the CRDs is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner_dev.binaries import ensure_binaries
from provisioner_dev.controlplane import ControlPlane
from provisioner_dev.crds import crd_names
from provisioner_dev.kubectl import run_kubectl
from tests.conftest import needs_own_controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), needs_own_controlplane]

ROOT = Path(__file__).resolve().parents[2]
# One test that runs anywhere, and two that need a control plane of their own.
SELECTED = (
    "tests/e2e/test_queue.py::test_queue_lifecycle",
    "tests/e2e/test_controlplane.py::test_server_reports_the_pinned_version",
    "tests/e2e/test_crash_safety.py::test_operator_survives_an_apiserver_restart",
)


@pytest.fixture
def theirs(tmp_path: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path / "theirs", ensure_binaries())
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


def names(kubeconfig: Path, kind: str) -> set[str]:
    result = run_kubectl(kubeconfig, "get", kind, "-o", "name")
    assert result.returncode == 0, result.stderr
    return {line.split("/", 1)[-1] for line in result.stdout.split()}


def test_the_suite_runs_against_an_existing_cluster(theirs: ControlPlane, tmp_path: Path):
    pids = {name: proc.pid for name, proc in theirs.procs.items()}
    namespaces = names(theirs.kubeconfig, "namespaces")
    roles = names(theirs.kubeconfig, "clusterroles")
    env = {
        **os.environ,
        "PROVISIONER_TEST_KUBECONFIG": str(theirs.kubeconfig),
        # Nothing may be built or found: the binaries are not needed at all.
        "PROVISIONER_CACHE": str(tmp_path / "no-cache"),
        "PATH": os.environ["PATH"],
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", *SELECTED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "1 passed, 2 skipped" in out, out[-4000:]
    assert out.count("PROVISIONER_TEST_KUBECONFIG names an existing cluster") == 2, out[-4000:]

    # The cluster ran it: the CRDs are there now, and its processes are the ones it had.
    assert set(crd_names()) <= names(theirs.kubeconfig, "crd")
    assert {name: proc.pid for name, proc in theirs.procs.items()} == pids
    assert all(proc.poll() is None for proc in theirs.procs.values())
    # The operator's ServiceAccount, namespace and ClusterRole(Binding) are taken out again
    # (namespace deletion may still be finishing: its name is gone or Terminating).
    assert names(theirs.kubeconfig, "clusterroles") == roles
    left = names(theirs.kubeconfig, "namespaces") - namespaces
    for ns in left:
        phase = run_kubectl(theirs.kubeconfig, "get", "ns", ns, "-o", "jsonpath={.status.phase}")
        assert phase.stdout in ("Terminating", ""), f"{ns} was left {phase.stdout}"
