"""kubectl against a cluster given by its kubeconfig: the dev tools' one way to talk to it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_kubectl(
    kubeconfig: str | Path, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def kubectl(kubeconfig: str | Path, *args: str, input: str | None = None) -> str:
    result = run_kubectl(kubeconfig, *args, input=input)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def cluster_answers(kubeconfig: str | Path) -> str:
    """ "" when the cluster in `kubeconfig` is ready, else why not (one line)."""
    try:
        result = run_kubectl(kubeconfig, "get", "--raw", "/readyz", timeout=15)
    except subprocess.TimeoutExpired:
        return "it did not answer within 15 s"
    if result.returncode == 0:
        return ""
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"kubectl exited with {result.returncode}"


def cluster_server(kubeconfig: str | Path) -> str:
    result = run_kubectl(
        kubeconfig, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    )
    return result.stdout.strip() if result.returncode == 0 else "?"
