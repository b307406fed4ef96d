"""KUBEBUILDER_ASSETS: a developer who already has envtest's kube-apiserver and etcd skips the
build. envtest ships no kube-controller-manager: the control plane then runs without one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provisioner_dev import binaries
from provisioner_dev.binaries import BuildError, ensure_binaries, envtest_binaries
from tests.conftest import needs_own_controlplane
from tests.e2e.test_dev_cli import dev

pytestmark = [pytest.mark.e2e, needs_own_controlplane]


@pytest.fixture
def assets(tmp_path: Path) -> Path:
    """envtest's layout (kube-apiserver, etcd, kubectl would be there too), made of links to
    the binaries this machine has."""
    ours = ensure_binaries()
    where = tmp_path / "envtest"
    where.mkdir()
    for name in ("kube-apiserver", "etcd"):
        (where / name).symlink_to(ours[name])
    return where


def test_assets_are_used_without_building(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    # With this project's cache, its controller-manager joins envtest's two.
    found = envtest_binaries()
    assert found is not None
    assert found["kube-apiserver"] == assets / "kube-apiserver"
    assert found["etcd"] == assets / "etcd"
    assert found["kube-controller-manager"].parent == binaries.components()[0].cache_dir
    # With an empty cache: none, and nothing is built.
    monkeypatch.setenv("PROVISIONER_CACHE", str(tmp_path / "empty-cache"))
    assert set(ensure_binaries()) == {"kube-apiserver", "etcd"}
    assert not (tmp_path / "empty-cache").exists()


def test_assets_without_etcd_are_refused_in_one_line(assets, monkeypatch):
    (assets / "etcd").unlink()
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    with pytest.raises(BuildError, match=r"KUBEBUILDER_ASSETS=.* has no executable etcd"):
        ensure_binaries()


def test_dev_up_runs_on_envtest_binaries_without_a_controller_manager(assets, tmp_path):
    env = {"KUBEBUILDER_ASSETS": str(assets), "PROVISIONER_CACHE": str(tmp_path / "no-cache")}
    try:
        up = dev(tmp_path, "up", "--no-operator", env=env)
        assert up.returncode == 0, up.stderr
        assert "KUBEBUILDER_ASSETS" in up.stderr and "no garbage collector" in up.stderr
        state = json.loads((tmp_path / ".dev/state.json").read_text())
        assert set(state["pids"]) == {"etcd", "kube-apiserver", "moto"}
        assert state["gc"] is False
        apiserver = state["processes"]["kube-apiserver"]
        assert os.path.realpath(f"/proc/{apiserver['pid']}/exe") == os.path.realpath(
            assets / "kube-apiserver"
        )
        # The CRDs are served: a custom resource can be applied and read back.
        kubeconfig = tmp_path / ".dev/kubeconfig"
        from provisioner_dev.kubectl import kubectl

        kubectl(kubeconfig, "create", "namespace", "t")
        kubectl(
            kubeconfig,
            "apply",
            "-n",
            "t",
            "-f",
            "-",
            input="apiVersion: cloud.provisioner.dev/v1beta1\nkind: Queue\n"
            "metadata: {name: q}\nspec: {}\n",
        )
        assert json.loads(kubectl(kubeconfig, "get", "queue", "q", "-n", "t", "-o", "json"))
        # A second `dev up` finds it whole (no controller-manager is not "dead").
        again = dev(tmp_path, "up", "--no-operator", env=env)
        assert again.returncode == 0, again.stderr
        assert json.loads((tmp_path / ".dev/state.json").read_text())["pids"] == state["pids"]
    finally:
        down = dev(tmp_path, "down", env=env)
        assert down.returncode == 0, down.stderr
    assert not (tmp_path / "no-cache").exists()
