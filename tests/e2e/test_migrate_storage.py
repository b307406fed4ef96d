"""`provisioner migrate-storage` on a cluster upgraded from the release before v1beta1.

Each test has a control plane of its own: status.storedVersions is one per CRD for the whole
cluster. It starts with the CRDs as that release had them (v1alpha1 alone, stored as such),
objects and connection Secrets written then; this release's CRDs are applied over them and
the conversion webhook (`provisioner webhook`, no operator: nothing else writes the objects)
serves. What the API server stores is read from etcd.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import GROUP
from provisioner.kinds.registry import KINDS
from provisioner_dev.crds import CRD_DIR, install_crds
from provisioner_dev.launch import Stack
from provisioner_dev.services import WebhookProcess
from tests.conftest import needs_own_controlplane
from tests.helpers import Kubectl

pytestmark = [pytest.mark.e2e, needs_own_controlplane]

OLD = "v1alpha1"
CRDS = [f"{k.plural}.{GROUP}" for k in KINDS]
PLURAL = {k.kind: k.plural for k in KINDS}
# Two objects of every kind, as the release before v1beta1 took them.
SPECS: dict[str, dict[str, Any]] = {
    "DatabaseInstance": {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "allocatedStorageGiB": 30,
    },
    "S3Bucket": {"writeConnectionSecretToRef": {"name": "files"}},
    "Queue": {},
    "Topic": {},
}
NAMES = ("one", "two")
MANAGED_BY = {"app.kubernetes.io/managed-by": "provisioner"}


def release_crds() -> list[dict[str, Any]]:
    """This release's CRDs of the four kinds, as crds/ has them."""
    docs = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                if doc["metadata"]["name"] in CRDS:
                    docs.append(doc)
    assert sorted(d["metadata"]["name"] for d in docs) == sorted(CRDS)
    return docs


def storage_of(crd: dict[str, Any]) -> str:
    (name,) = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    return str(name)


def previous_release_crds() -> list[dict[str, Any]]:
    """The same CRDs as the release before: v1alpha1 alone, stored as v1alpha1, no conversion."""
    docs = []
    for doc in release_crds():
        old = [dict(v, served=True, storage=True) for v in doc["spec"]["versions"]]
        old = [v for v in old if v["name"] == OLD]
        assert old, f"{doc['metadata']['name']} no longer serves {OLD}"
        spec = {k: v for k, v in doc["spec"].items() if k != "conversion"}
        docs.append({**doc, "spec": {**spec, "versions": old}})
    return docs


def write_previous_release_crds(into: Path) -> Path:
    """crds/ as the release before had it: the four kinds' CRDs at v1alpha1 alone, the others
    as they are."""
    previous = {doc["metadata"]["name"]: doc for doc in previous_release_crds()}
    into.mkdir(parents=True)
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        doc = previous.get(doc["metadata"]["name"], doc)
        (into / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return into


NEW = storage_of(release_crds()[0])


def stored_versions_of(kube: Kubectl, crd: str) -> list[str]:
    got = kube.kubectl("get", "crd", crd, "-o", "json").stdout
    return list(json.loads(got)["status"]["storedVersions"])


def etcd_version(etcd_url: str, plural: str, namespace: str, name: str) -> str:
    """The version of the object as etcd holds it (custom resources are stored as JSON),
    through etcd's JSON gateway."""
    key = f"/registry/{GROUP}/{plural}/{namespace}/{name}"
    request = urllib.request.Request(  # noqa: S310 - the test's own etcd, on loopback
        f"{etcd_url}/v3/kv/range",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback etcd
        found = json.loads(resp.read())
    kvs = found.get("kvs") or []
    assert kvs, f"etcd has no {key}"
    stored = json.loads(base64.b64decode(kvs[0]["value"]))
    group, _, version = str(stored["apiVersion"]).partition("/")
    assert group == GROUP, key
    return version


@dataclass
class Upgraded:
    stack: Stack
    kube: Kubectl
    namespace: str
    # (kind, name) -> uid
    objects: dict[tuple[str, str], str]

    @property
    def etcd_url(self) -> str:
        return self.stack.controlplane.etcd_url

    def stored_versions(self, crd: str) -> list[str]:
        return stored_versions_of(self.kube, crd)

    def etcd_versions(self) -> dict[tuple[str, str], str]:
        return {
            (kind, name): etcd_version(self.etcd_url, PLURAL[kind], self.namespace, name)
            for kind, name in self.objects
        }

    def secret(self, name: str) -> dict[str, Any]:
        got = self.kube.kubectl("get", "secret", name, "-n", self.namespace, "-o", "json")
        return dict(json.loads(got.stdout))

    def at_old_version(self, kind: str, name: str) -> dict[str, Any]:
        got = self.kube.kubectl(
            "get", f"{PLURAL[kind]}.{OLD}.{GROUP}", name, "-n", self.namespace, "-o", "json"
        )
        return dict(json.loads(got.stdout))

    def migrate(self, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        clean = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PROVISIONER_CRASHPOINTS", "KUBERNETES_SERVICE_HOST", "KUBECONFIG")
        }
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "provisioner",
                "migrate-storage",
                "--kubeconfig",
                str(self.stack.kubeconfig),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env={**clean, **(env or {})},
            check=False,
        )


def secret_name(kind: str, name: str) -> str:
    return f"{kind.lower()}-{name}-connection"


@pytest.fixture
def upgraded(tmp_path: Path) -> Iterator[Upgraded]:
    """A cluster as the release before v1beta1 left it, then upgraded to this release's CRDs
    with the conversion webhook serving; nothing migrated yet."""
    # The webhook of this release refuses to start on CRDs without v1beta1: it starts after.
    # The stack starts with the previous release's CRDs: deleting a CRD waits on the API
    # server's CRD finalizer, which takes minutes on a busy machine.
    stack = Stack(
        dir=tmp_path / "stack",
        serve_webhook=False,
        crd_dir=write_previous_release_crds(tmp_path / "previous-crds"),
    )
    try:
        stack.start()
        yield upgrade(stack)
    finally:
        stack.stop()
        if not os.environ.get("PROVISIONER_KEEP_TEST_DIR"):
            shutil.rmtree(stack.dir, ignore_errors=True)  # etcd's files are large


def upgrade(stack: Stack) -> Upgraded:
    kube = Kubectl(stack.kubeconfig)
    for crd in CRDS:
        assert stored_versions_of(kube, crd) == [OLD], crd
    namespace = f"migrate-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", namespace)
    docs = [
        {
            "apiVersion": f"{GROUP}/{OLD}",
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        for kind, spec in SPECS.items()
        for name in NAMES
    ]
    created = kube.kubectl("apply", "-o", "json", "-f", "-", input=yaml.safe_dump_all(docs))
    items = json.loads(created.stdout)["items"]
    objects = {(o["kind"], o["metadata"]["name"]): o["metadata"]["uid"] for o in items}
    # Each object's connection Secret, owned as the release before wrote it; and one Secret
    # with the label that the operator does not own (its owner is a ConfigMap).
    secrets = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name(kind, name),
                "namespace": namespace,
                "labels": MANAGED_BY,
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{OLD}",
                        "kind": kind,
                        "name": name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "stringData": {"name": name},
        }
        for (kind, name), uid in objects.items()
    ]
    owner = json.loads(
        kube.kubectl("create", "configmap", "owner", "-n", namespace, "-o", "json").stdout
    )
    secrets.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "not-ours",
                "namespace": namespace,
                "labels": MANAGED_BY,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "stringData": {"note": "not the operator's"},
        }
    )
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets))

    # The upgrade: this release's CRDs, then the webhook (it points them at itself).
    install_crds(stack.kubeconfig)
    stack.webhook = WebhookProcess(log=stack.dir / "webhook.log", kubeconfig=str(stack.kubeconfig))
    stack.webhook.start()
    up = Upgraded(stack, kube, namespace, objects)
    for crd in CRDS:
        assert up.stored_versions(crd) == [OLD, NEW], crd
    assert set(up.etcd_versions().values()) == {OLD}
    return up


def expected_lines(objects: int, secrets: int, was: list[str]) -> list[str]:
    def n(count: int, word: str) -> str:
        return f"{count} {word}" + ("" if count == 1 else "s")

    return [
        f"{crd}: {n(objects, 'object')} rewritten at {NEW}, {n(secrets, 'Secret')} updated, "
        f"storedVersions [{NEW}] (was [{', '.join(was)}])"
        for crd in CRDS
    ]


def test_every_object_is_stored_at_the_new_version_then_the_old_one_is_dropped(upgraded):
    up = upgraded
    before = {key: up.at_old_version(*key) for key in up.objects}
    not_ours = up.secret("not-ours")

    done = up.migrate()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected_lines(len(NAMES), len(NAMES), [OLD, NEW])
    assert done.stderr == ""

    for crd in CRDS:
        assert up.stored_versions(crd) == [NEW], crd
    assert set(up.etcd_versions().values()) == {NEW}
    for (kind, name), uid in up.objects.items():
        refs = up.secret(secret_name(kind, name))["metadata"]["ownerReferences"]
        assert refs == [
            {
                "apiVersion": f"{GROUP}/{NEW}",
                "kind": kind,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        # Read at the old version, the object is what it was (the conversion is lossless).
        after = up.at_old_version(kind, name)
        assert after["spec"] == before[(kind, name)]["spec"], (kind, name)
    assert (
        up.secret("not-ours")["metadata"]["resourceVersion"]
        == (not_ours["metadata"]["resourceVersion"])
    )

    # Again: the same objects written back (no change stored), no Secret left to update.
    versions = {key: up.at_old_version(*key)["metadata"]["resourceVersion"] for key in up.objects}
    again = up.migrate()
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == expected_lines(len(NAMES), 0, [NEW])
    for crd in CRDS:
        assert up.stored_versions(crd) == [NEW], crd
    assert {
        key: up.at_old_version(*key)["metadata"]["resourceVersion"] for key in up.objects
    } == versions


def test_killed_after_the_first_object_the_old_version_stays_listed_until_a_rerun(upgraded):
    up = upgraded
    killed = up.migrate(env={"PROVISIONER_CRASHPOINTS": "migrate-after-object"})
    assert killed.returncode == -9, (killed.returncode, killed.stdout, killed.stderr)
    assert killed.stdout == ""

    # The first CRD had one object written, then the process died: nothing claims more.
    first = KINDS[0].kind
    stored = up.etcd_versions()
    assert sorted(v for (kind, _), v in stored.items() if kind == first) == [OLD, NEW]
    assert {v for (kind, _), v in stored.items() if kind != first} == {OLD}
    for crd in CRDS:
        assert up.stored_versions(crd) == [OLD, NEW], crd

    # With the webhook down, what is stored at v1alpha1 cannot be read at v1beta1: one line.
    webhook = up.stack.webhook
    assert webhook is not None
    webhook.stop()
    refused = up.migrate()
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(f"provisioner migrate-storage: {CRDS[0]}: "), refused.stderr
    assert "is it running?" in refused.stderr
    assert up.stored_versions(CRDS[0]) == [OLD, NEW]
    webhook.start()

    rerun = up.migrate()
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines() == expected_lines(len(NAMES), len(NAMES), [OLD, NEW])
    for crd in CRDS:
        assert up.stored_versions(crd) == [NEW], crd
    assert set(up.etcd_versions().values()) == {NEW}
    for (kind, name), _ in up.objects.items():
        refs = up.secret(secret_name(kind, name))["metadata"]["ownerReferences"]
        assert [r["apiVersion"] for r in refs] == [f"{GROUP}/{NEW}"]
