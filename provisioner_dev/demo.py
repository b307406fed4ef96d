"""`make demo`: bring everything up, apply examples/, and show every kind Ready."""

from __future__ import annotations

import json
import time

from provisioner_dev.binaries import REPO_ROOT
from provisioner_dev.kubectl import kubectl
from provisioner_dev.stack import DevStack

NAMESPACE = "demo"
# Every kind of ours is in the `cloud` category.
KINDS = "cloud"


def run(stack: DevStack, timeout: float = 120.0) -> int:
    state = stack.up()
    kubeconfig = state["kubeconfig"]
    print(f"control plane {state['controlplane']['apiserver_url']}, moto {state['moto_url']}: up")
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        input=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n",
    )
    print(kubectl(kubeconfig, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "examples")).rstrip())
    started = time.monotonic()
    kubectl(
        kubeconfig,
        "wait",
        "-n",
        NAMESPACE,
        KINDS,
        "--all",
        "--for=condition=Ready",
        f"--timeout={int(timeout)}s",
    )
    print(f"\nall Ready in {time.monotonic() - started:.1f}s\n")
    print("$ kubectl get cloud -A")
    print(kubectl(kubeconfig, "get", "cloud", "-A").rstrip())
    print()
    items = json.loads(kubectl(kubeconfig, "get", KINDS, "-n", NAMESPACE, "-o", "json"))["items"]
    for item in items:
        secret_name = item["status"]["connectionSecret"]
        secret = json.loads(
            kubectl(kubeconfig, "get", "secret", secret_name, "-n", NAMESPACE, "-o", "json")
        )
        keys = ", ".join(sorted(secret.get("data", {})))
        print(
            f"Secret {NAMESPACE}/{secret_name} ({item['kind']} {item['metadata']['name']}): {keys}"
        )
    print(
        "\nIt keeps running. Try it yourself:\n"
        "  source .dev/env && kubectl get cloud -A\n"
        "  kubectl describe dbi -n demo demo-db\n"
        "Stop everything with: make down"
    )
    return 0
