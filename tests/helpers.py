"""Waiting on conditions with a deadline, and reading what a user would read."""

from __future__ import annotations

import base64
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from provisioner_dev.cloud import DevCloud, inventory
from provisioner_dev.kubectl import run_kubectl

T = TypeVar("T")


class Kubectl:
    """kubectl against any cluster's kubeconfig, the way the session's `Cluster` offers it."""

    def __init__(self, kubeconfig: str | Path) -> None:
        self.kubeconfig = str(kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> Any:
        result = run_kubectl(self.kubeconfig, *args, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 60,
    what: str = "condition",
    every: float = 0.2,
) -> T:
    """Poll `probe` until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


def get(kube, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    result = kube.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    return json.loads(result.stdout)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(obj: dict[str, Any] | None, type_: str) -> bool:
    c = condition(obj, type_)
    return bool(c and c.get("status") == "True")


def wait_ready(
    kube, kind: str, namespace: str, name: str, timeout: float = 60, generation: int | None = None
) -> dict[str, Any]:
    """Ready and Synced for the current generation (and that is `generation`, when given)."""

    def probe() -> dict[str, Any] | None:
        obj = get(kube, kind, namespace, name)
        if obj and is_true(obj, "Ready") and is_true(obj, "Synced"):
            observed = obj["status"].get("observedGeneration")
            if observed == obj["metadata"]["generation"] and generation in (None, observed):
                return obj
        return None

    what = f"{kind} {namespace}/{name} Ready" + (
        f" at generation {generation}" if generation else ""
    )
    return wait_for(probe, timeout=timeout, what=what)


def wait_condition(
    kube,
    kind: str,
    namespace: str,
    name: str,
    type_: str,
    status: str,
    reason: str,
    timeout: float = 60,
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = get(kube, kind, namespace, name)
        c = condition(obj, type_)
        if c and c.get("status") == status and c.get("reason") == reason:
            return obj
        return None

    return wait_for(probe, timeout=timeout, what=f"{kind} {name} {type_}={status}/{reason}")


def wait_gone(kube, kind: str, namespace: str, name: str, timeout: float = 60) -> None:
    wait_for(
        lambda: get(kube, kind, namespace, name) is None,
        timeout=timeout,
        what=f"{kind} {namespace}/{name} to be gone",
    )


def secret_data(kube, namespace: str, name: str) -> dict[str, str] | None:
    result = kube.kubectl("get", "secret", name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def events(kube, namespace: str, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    """The Events about the object `name` (only those of `reason`, when given)."""
    result = kube.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name}",
        "-o",
        "json",
    )
    found = json.loads(result.stdout)["items"]
    return [e for e in found if e["reason"] == reason] if reason else found


def apply(kube, namespace: str, manifest: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)


def try_apply(kube, namespace: str, manifest: str, *flags: str) -> Any:
    """`kubectl apply` that may be refused: the finished process, to read its stderr."""
    return kube.kubectl("apply", *flags, "-n", namespace, "-f", "-", input=manifest, check=False)


def assert_refused(result: Any, expected: str) -> None:
    assert result.returncode != 0, f"the API server accepted it:\n{result.stdout}"
    assert expected in result.stderr, f"{expected!r} not in:\n{result.stderr}"


def owned_cloud_resources(aws, uid: str) -> list[tuple[str, str]]:
    """Every cloud resource whose owner-uid tag is `uid`: there must be one per CR."""
    cloud = _dev_cloud(aws.s3.meta.endpoint_url)
    return [(r.kind, r.name) for r in inventory(cloud) if r.owner_uid == uid]


@functools.cache
def _dev_cloud(endpoint_url: str) -> DevCloud:
    return DevCloud(endpoint_url)


def manifests(kind_specs: list[tuple[str, str, str]], version: str = "v1alpha1") -> str:
    """Multi-document YAML from (kind, name, inline spec) triples, written at `version`."""
    return "".join(
        f"---\napiVersion: cloud.provisioner.dev/{version}\nkind: {kind}\n"
        f"metadata:\n  name: {name}\nspec: {spec}\n"
        for kind, name, spec in kind_specs
    )


def resource_class(name: str, kind: str, namespace_labels: dict[str, str], **spec: Any) -> str:
    """A ResourceClass of `kind` selecting the namespaces with `namespace_labels`, as JSON
    (which kubectl reads as YAML)."""
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "ResourceClass",
        "metadata": {"name": name},
        "spec": {"kind": kind, "namespaceSelector": {"matchLabels": namespace_labels}, **spec},
    }
    return json.dumps(body)


def merge_patch(kube, kind: str, namespace: str, name: str, patch: str) -> None:
    """`kubectl patch --type=merge`, as a user changes a field of a CR."""
    kube.kubectl("patch", kind, name, "-n", namespace, "--type=merge", "-p", patch)
