"""The operator's CRDs (crds/) in a cluster: applied, named, and converted by the webhook."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from provisioner_dev.binaries import REPO_ROOT
from provisioner_dev.kubectl import kubectl, run_kubectl

CRD_DIR = REPO_ROOT / "crds"


def install_crds(kubeconfig: str | Path, crd_dir: Path = CRD_DIR) -> None:
    """Apply the CRDs (server-side) and wait until they are established.

    A CRD whose conversion webhook a loopback webhook already points at a `url` keeps that
    clientConfig: the file's `service` beside it would be refused (one of url or service).
    """
    with tempfile.TemporaryDirectory() as tmp:
        source = _keeping_webhook_urls(kubeconfig, crd_dir, Path(tmp))
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(source))
        kubectl(
            kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(source)
        )


def _keeping_webhook_urls(kubeconfig: str | Path, crd_dir: Path, tmp: Path) -> Path:
    import yaml

    listed = run_kubectl(kubeconfig, "get", "crd", "-o", "json")
    live = {
        crd["metadata"]["name"]: crd
        for crd in (json.loads(listed.stdout)["items"] if listed.returncode == 0 else [])
    }
    changed = False
    for path in sorted(crd_dir.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        found = live.get(doc["metadata"]["name"]) or {}
        config = (((found.get("spec") or {}).get("conversion") or {}).get("webhook") or {}).get(
            "clientConfig"
        ) or {}
        wanted = (doc["spec"].get("conversion") or {}).get("webhook")
        if config.get("url") and wanted is not None:
            wanted["clientConfig"] = config
            changed = True
        (tmp / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp if changed else crd_dir


def crd_names() -> list[str]:
    """The names of the CRDs in crds/ (`queues.cloud.provisioner.dev`, ...)."""
    import yaml

    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


# A v1alpha1 object the API server must convert to store (v1beta1): only a dry run, to see
# the conversion webhook answer.
_PROBE = """apiVersion: cloud.provisioner.dev/v1alpha1
kind: Topic
metadata:
  name: conversion-probe
  namespace: default
spec:
  writeConnectionSecretToRef:
    name: conversion-probe
"""


def conversion_answers(kubeconfig: str | Path) -> bool:
    """Whether the API server converts v1alpha1 through the webhook now, and lists every
    kind again (pointing the CRDs at the webhook updates them, and the API server answers
    429 "storage is (re)initializing" to lists for a moment after a CRD update)."""
    done = run_kubectl(
        kubeconfig, "create", "--dry-run=server", "-o", "name", "-f", "-", input=_PROBE
    )
    if done.returncode != 0:
        return False
    kinds = ",".join(f"{plural}.cloud.provisioner.dev" for plural in _PLURALS)
    return run_kubectl(kubeconfig, "get", kinds, "-A", "-o", "name").returncode == 0


_PLURALS = ("databaseinstances", "s3buckets", "queues", "topics")
