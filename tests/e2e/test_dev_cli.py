"""`provisioner dev up|status|down`: idempotent, stale state cleaned, nothing left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner_dev.processes import alive
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


def dev(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", "dev", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_up_is_idempotent_stale_state_is_cleaned_and_down_stops_everything(tmp_path):
    up = dev(tmp_path, "up", "--no-operator")
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / ".dev/state.json").read_text())
    pids = state["pids"]
    assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "moto"}
    env = (tmp_path / ".dev/env").read_text()
    for key in (
        "KUBECONFIG",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert f"export {key}=" in env
    kubeconfig = tmp_path / ".dev/kubeconfig"
    ns = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "get", "crd", "queues.cloud.provisioner.dev"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ns.returncode == 0, ns.stderr

    again = dev(tmp_path, "up", "--no-operator")
    assert again.returncode == 0
    assert json.loads((tmp_path / ".dev/state.json").read_text())["pids"] == pids
    assert dev(tmp_path, "status").returncode == 0

    # A dead run: etcd and the API server die; status says so, up cleans and starts afresh.
    os.kill(pids["kube-apiserver"], 9)
    os.kill(pids["etcd"], 9)
    wait_for(lambda: not alive(pids["etcd"]), timeout=10, what="etcd to die")
    assert dev(tmp_path, "status").returncode != 0
    fresh = dev(tmp_path, "up", "--no-operator")
    assert fresh.returncode == 0, fresh.stderr
    assert "stale" in fresh.stderr
    new_pids = json.loads((tmp_path / ".dev/state.json").read_text())["pids"]
    assert not set(new_pids.values()) & set(pids.values())
    assert not any(alive(pid) for pid in pids.values()), "the stale run left processes behind"
    data_dir = Path(json.loads((tmp_path / ".dev/state.json").read_text())["data_dir"])

    down = dev(tmp_path, "down")
    assert down.returncode == 0
    wait_for(
        lambda: not any(alive(pid) for pid in new_pids.values()),
        timeout=20,
        what="every process to stop",
    )
    assert not data_dir.exists()
    assert not (tmp_path / ".dev/state.json").exists()


def test_missing_go_toolchain_is_one_clear_line(tmp_path):
    result = dev(
        tmp_path,
        "build",
        env={"PATH": "/usr/bin:/bin", "PROVISIONER_CACHE": str(tmp_path / "empty-cache")},
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Go toolchain not found" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
