"""kro's controller (https://kro.run) beside a stack, for docs/composition.md's test.

It is built like helm: from a pinned Go module (hack/kro), on demand, once per machine, cached
in ~/.cache/provisioner/kro-<version>/. Its CRDs come from the same module's source, in the
Go module cache. The controller runs as a child process against a kubeconfig, the way its
Deployment runs it in a cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from provisioner_dev.binaries import (
    GO_ENV,
    REPO_ROOT,
    BuildError,
    Component,
    cached_binaries,
    ensure,
    go_binary,
)
from provisioner_dev.processes import LoopbackService, free_port
from provisioner_dev.services import http_up

KRO_VERSION = "v0.9.4"
KRO_MODULE = "github.com/kubernetes-sigs/kro"


def kro_component() -> Component:
    return Component(
        name="kro",
        version=KRO_VERSION,
        module_dir=REPO_ROOT / "hack" / "kro",
        packages={"kro": f"{KRO_MODULE}/cmd/controller"},
        ldflags=f"-s -w -X sigs.k8s.io/release-utils/version.gitVersion={KRO_VERSION}",
    )


def cached_kro() -> Path | None:
    """The cached controller if it is built and intact; never builds."""
    found = cached_binaries(kro_component())
    return found["kro"] if found else None


def ensure_kro() -> Path:
    """kro's controller, built on demand (once per machine); BuildError if it cannot be."""
    return ensure(kro_component())["kro"]


def kro_crds() -> list[Path]:
    """The CRDs of the pinned kro (ResourceGraphDefinition, GraphRevision), from its module."""
    go = go_binary()
    try:
        found = subprocess.run(
            [go, "mod", "download", "-json", KRO_MODULE],
            cwd=kro_component().module_dir,
            env=dict(os.environ, **GO_ENV),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot find kro's module source: {exc}") from None
    if found.returncode != 0:
        raise BuildError(f"cannot find kro's module source: {found.stderr.strip()}")
    crds = sorted((Path(json.loads(found.stdout)["Dir"]) / "helm" / "crds").glob("*.yaml"))
    if not crds:
        raise BuildError(f"kro {KRO_VERSION}'s module has no helm/crds/*.yaml")
    return crds


# What kro's chart grants its controller in `rbac.mode: aggregation` (its ClusterRole
# `kro:controller:static`), before the ClusterRoles aggregated into it.
KRO_STATIC_RULES: list[dict[str, list[str]]] = [
    {
        "apiGroups": ["kro.run"],
        "resources": ["resourcegraphdefinitions"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": ["kro.run"],
        "resources": ["resourcegraphdefinitions/finalizers"],
        "verbs": ["update"],
    },
    {
        "apiGroups": ["kro.run"],
        "resources": ["resourcegraphdefinitions/status"],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": ["internal.kro.run"],
        "resources": ["graphrevisions"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": ["internal.kro.run"],
        "resources": ["graphrevisions/finalizers"],
        "verbs": ["update"],
    },
    {
        "apiGroups": ["internal.kro.run"],
        "resources": ["graphrevisions/status"],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


@dataclass(kw_only=True)
class KroController(LoopbackService):
    """kro's controller as a child process; `port` is its health probe port."""

    binary: Path
    kubeconfig: str

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        self.launch(
            [
                str(self.binary),
                f"--health-probe-bind-address=127.0.0.1:{self.port}",
                "--metrics-bind-address=0",
                # Instances wait for our resources to become Ready: look again every second.
                "--instance-requeue-interval=1s",
            ],
            lambda: http_up(f"{self.url}/readyz"),
            what="kro controller",
            timeout=timeout,
            env=dict(os.environ, KUBECONFIG=self.kubeconfig),
        )
