"""An upgrade from the release before v1beta1, on a real API server, as a platform team runs it.

The CRDs (v1alpha1 only) and the operator of that release (its own code, checked out of this
repository's history) run first: one resource of each kind becomes Ready with its Secret. Then
the upgrade as docs/api.md gives it: `kubectl apply --server-side` of this release's CRDs, this
release's operator (it serves the conversion webhook itself, on loopback), and `provisioner
migrate-storage`. Through all of it the resources stay Ready and nothing changes in the cloud
(every request moto receives is recorded and read). On the way: both versions are read with
kubectl, a v1alpha1 resource written after the upgrade is reconciled like a v1beta1 one,
what kubectl prints while the webhook is down, and v1alpha1 dropped from serving at the end.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pytest

from provisioner_dev.binaries import REPO_ROOT
from provisioner_dev.launch import Stack
from provisioner_dev.processes import fixed_port
from tests.conftest import needs_own_controlplane, on_moto_only
from tests.helpers import Kubectl, wait_for

pytestmark = [pytest.mark.e2e, needs_own_controlplane, on_moto_only]

# The last release that served v1alpha1 alone.
PREVIOUS = "9e6616bc"
GROUP = "cloud.provisioner.dev"
NS = "upgrade"
PLURALS = {
    "DatabaseInstance": "databaseinstances",
    "S3Bucket": "s3buckets",
    "Queue": "queues",
    "Topic": "topics",
}
OLD_OBJECTS = f"""
apiVersion: {GROUP}/v1alpha1
kind: DatabaseInstance
metadata: {{name: orders}}
spec:
  engine: postgres
  instanceClass: db.t3.micro
  allocatedStorageGiB: 30
  deletionPolicy: Delete
  writeConnectionSecretToRef: {{name: orders-db}}
---
apiVersion: {GROUP}/v1alpha1
kind: S3Bucket
metadata: {{name: assets}}
spec: {{versioning: true}}
---
apiVersion: {GROUP}/v1alpha1
kind: Queue
metadata: {{name: jobs}}
spec: {{visibilityTimeoutSeconds: 45}}
---
apiVersion: {GROUP}/v1alpha1
kind: Topic
metadata: {{name: news}}
spec: {{}}
"""
# Calls that change something in the cloud, by their action's first word.
WRITES = (
    "Create",
    "Delete",
    "Modify",
    "Put",
    "Set",
    "Tag",
    "Untag",
    "Add",
    "Remove",
    "Subscribe",
    "Unsubscribe",
    "Reboot",
)


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=False)


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    """The previous release's operator package and CRDs, from git."""
    if git("cat-file", "-e", f"{PREVIOUS}^{{commit}}").returncode != 0:
        pytest.skip(f"the repository's history lacks {PREVIOUS} (a shallow clone)")
    archive = git("archive", "--format=tar", PREVIOUS, "provisioner", "crds")
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path / "previous", filter="data")
    return tmp_path / "previous"


@pytest.fixture
def stack(previous: Path, tmp_path: Path) -> Iterator[Stack]:
    with Stack(
        dir=tmp_path / "stack", record=True, serve_webhook=False, crd_dir=previous / "crds"
    ) as running:
        yield running


def requests(stack: Stack) -> list[dict]:
    path = stack.recording
    assert path is not None
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(errors="replace").splitlines()]


def action(entry: dict) -> str:
    """The AWS action of a recorded request (S3's REST calls as METHOD path)."""
    body = entry.get("body") or ""
    if entry.get("body_encoded"):
        body = base64.b64decode(body).decode(errors="replace")
    target = (entry.get("headers") or {}).get("X-Amz-Target", "")
    if target:
        return target.rsplit(".", 1)[-1]
    for part in str(body).split("&"):
        if part.startswith("Action="):
            return part[len("Action=") :]
    return f"{entry.get('method', '')} {entry.get('url', '')}"


def writes(entries: list[dict]) -> list[str]:
    found = []
    for entry in entries:
        name = action(entry)
        if name.startswith(WRITES) or name.split(" ")[0] in ("PUT", "POST", "DELETE"):
            found.append(name)
    return found


def all_ready(kube: Kubectl, version: str) -> bool:
    for plural in PLURALS.values():
        items = kube.json("get", f"{plural}.{version}.{GROUP}", "-n", NS)["items"]
        for item in items:
            conditions = {
                c["type"]: c["status"] for c in (item.get("status") or {}).get("conditions", [])
            }
            if conditions.get("Ready") != "True":
                return False
    return True


def secrets(kube: Kubectl) -> dict[str, dict]:
    items = kube.json("get", "secrets", "-n", NS)["items"]
    return {s["metadata"]["name"]: s for s in items}


STORED = [("databaseinstances", "orders"), ("s3buckets", "assets"), ("queues", "jobs")]


def stored_at(stack: Stack, plural: str, name: str) -> str:
    """The apiVersion an object is stored at, read from etcd's JSON gateway."""
    key = base64.b64encode(f"/registry/{GROUP}/{plural}/{NS}/{name}".encode()).decode()
    request = urllib.request.Request(  # noqa: S310 - loopback etcd
        f"{stack.controlplane.etcd_url}/v3/kv/range", data=json.dumps({"key": key}).encode()
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
        value = json.loads(answer.read())["kvs"][0]["value"]
    return json.loads(base64.b64decode(value))["apiVersion"]


def test_upgrade_keeps_everything_ready_with_no_cloud_change(stack: Stack, previous: Path):
    kube = Kubectl(stack.kubeconfig)
    kube.kubectl("create", "namespace", NS)
    # 1. The previous release, as it ran.
    old = stack.start_operator(package_dir=previous, args=["--resync-seconds=3600"])
    kube.kubectl("apply", "-n", NS, "-f", "-", input=OLD_OBJECTS)
    wait_for(lambda: all_ready(kube, "v1alpha1"), timeout=120, what="Ready under v1alpha1")
    before = secrets(kube)
    assert {"orders-db", "assets-connection", "jobs-connection", "news-connection"} <= set(before)
    old.stop()
    settled = len(requests(stack))

    # This release's operator refuses the previous CRDs, in one line, before doing anything.
    refused = subprocess.run(
        [sys.executable, "-m", "provisioner", "run", "--webhook=off"],
        env={"KUBECONFIG": str(stack.kubeconfig), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("provisioner: CRD ") and "does not serve v1beta1" in last, last
    assert "kubectl apply --server-side" in last
    print(f"\nthis release's operator on the previous CRDs: {last}")

    # 2. This release's CRDs (server-side apply takes over the fields kubectl set before).
    done = kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds")
    )
    assert "serverside-applied" in done.stdout
    # 3. This release's operator: it checks the CRDs, serves the webhook, points them at it.
    port = fixed_port()
    new = stack.start_operator(
        args=["--resync-seconds=3600", "--webhook=on", f"--webhook-port={port}"]
    )
    wait_for(lambda: all_ready(kube, "v1beta1"), timeout=60, what="Ready read as v1beta1")
    # Both versions are served and read with kubectl.
    alpha = kube.json("get", f"databaseinstances.v1alpha1.{GROUP}", "orders", "-n", NS)
    beta = kube.json("get", f"databaseinstances.v1beta1.{GROUP}", "orders", "-n", NS)
    assert alpha["spec"]["allocatedStorageGiB"] == 30
    assert alpha["spec"]["writeConnectionSecretToRef"] == {"name": "orders-db"}
    assert beta["spec"]["storage"] == {"sizeGiB": 30}
    assert beta["spec"]["connectionSecret"] == {"name": "orders-db"}
    for spelled in ("dbi", f"dbi.v1alpha1.{GROUP}", f"dbi.v1beta1.{GROUP}"):
        listed = kube.kubectl("get", spelled, "-n", NS).stdout.splitlines()
        assert [line.split()[:2] for line in listed[1:]] == [["orders", "True"]], spelled

    # 4. A resource written as v1alpha1 after the upgrade is handled like one written as v1beta1.
    kube.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=f"""
apiVersion: {GROUP}/v1alpha1
kind: Queue
metadata: {{name: late-alpha}}
spec: {{visibilityTimeoutSeconds: 60, writeConnectionSecretToRef: {{name: late-alpha-q}}}}
---
apiVersion: {GROUP}/v1beta1
kind: Queue
metadata: {{name: late-beta}}
spec: {{visibilityTimeoutSeconds: 60, connectionSecret: {{name: late-beta-q}}}}
""",
    )
    wait_for(lambda: all_ready(kube, "v1beta1"), timeout=60, what="the new queues Ready")
    after = secrets(kube)
    assert {"late-alpha-q", "late-beta-q"} <= set(after)
    assert set(after["late-alpha-q"]["data"]) == set(after["late-beta-q"]["data"])
    alpha_q = kube.json("get", f"queues.v1beta1.{GROUP}", "late-alpha", "-n", NS)
    beta_q = kube.json("get", f"queues.v1beta1.{GROUP}", "late-beta", "-n", NS)
    assert alpha_q["spec"] == {**beta_q["spec"], "connectionSecret": {"name": "late-alpha-q"}}

    # Nothing in the cloud changed for the four resources of before: the only writes since
    # the old operator stopped are the two new queues'.
    since = writes(requests(stack)[settled:])
    assert any("CreateQueue" in w for w in since), since
    assert_untouched(requests(stack)[settled:])
    # The four Secrets of before were not rewritten.
    for name in ("orders-db", "assets-connection", "jobs-connection", "news-connection"):
        assert (
            after[name]["metadata"]["resourceVersion"]
            == before[name]["metadata"]["resourceVersion"]
        ), name

    # Not even written in Kubernetes: still stored as the previous release left them.
    assert {stored_at(stack, p, n) for p, n in STORED} == {f"{GROUP}/v1alpha1"}

    # 5. The webhook down: what kubectl prints, and nothing lost.
    new.stop()
    # Lists (and kubectl's tables) come from the API server's cache, converted while the
    # webhook was up; reading one object reads etcd, and what etcd holds is converted again.
    assert "orders" in kube.kubectl("get", "dbi", "-n", NS).stdout
    down = kube.kubectl("get", "dbi", "orders", "-n", NS, "-o", "yaml", check=False)
    assert down.returncode != 0
    assert "conversion webhook" in down.stderr, down.stderr
    print(f"\nkubectl get dbi orders -o yaml with the webhook down:\n{down.stderr.strip()}")
    refused = kube.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=f"apiVersion: {GROUP}/v1alpha1\nkind: Topic\n"
        "metadata: {name: while-down}\nspec: {}\n",
        check=False,
    )
    assert refused.returncode != 0 and "conversion webhook" in refused.stderr
    print(f"kubectl apply of a v1alpha1 Topic with the webhook down:\n{refused.stderr.strip()}")
    new.start()
    wait_for(lambda: all_ready(kube, "v1alpha1"), timeout=60, what="v1alpha1 readable again")

    # 6. Storage migration, then v1alpha1 no longer served.
    migrated = subprocess.run(
        [sys.executable, "-m", "provisioner", "migrate-storage"],
        env={"KUBECONFIG": str(stack.kubeconfig), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    print(migrated.stdout)
    for plural in PLURALS.values():
        crd = kube.json("get", "crd", f"{plural}.{GROUP}")
        assert crd["status"]["storedVersions"] == ["v1beta1"], plural
    assert {stored_at(stack, p, n) for p, n in STORED} == {f"{GROUP}/v1beta1"}
    for plural in PLURALS.values():
        crd = kube.json("get", "crd", f"{plural}.{GROUP}")
        versions = crd["spec"]["versions"]
        for version in versions:
            if version["name"] == "v1alpha1":
                version["served"] = False
        kube.kubectl(
            "patch",
            "crd",
            f"{plural}.{GROUP}",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"versions": versions}}),
        )
    # With the operator (and so the webhook) stopped, everything reads at v1beta1: what is
    # stored is v1beta1, no conversion is needed.
    new.stop()
    assert all_ready(kube, "v1beta1")
    assert len(kube.json("get", f"databaseinstances.v1beta1.{GROUP}", "-n", NS)["items"]) == 1
    gone = kube.kubectl("get", f"databaseinstances.v1alpha1.{GROUP}", "-n", NS, check=False)
    assert gone.returncode != 0
    assert secrets(kube).keys() == after.keys()
    # Nothing of before was written in the cloud through the whole upgrade.
    during = requests(stack)[settled:]
    assert_untouched(during)
    print(
        f"AWS calls from the previous operator's stop to the end: {len(during)}, "
        f"of them writes: {writes(during)} (the two queues created after the upgrade)"
    )


def assert_untouched(entries: list[dict]) -> None:
    """No write in `entries` names one of the four resources made before the upgrade."""
    for entry in entries:
        if writes([entry]):
            text = json.dumps(entry)
            touched = [n for n in ("orders", "assets", "jobs", "news") if f"{NS}-{n}" in text]
            assert not touched, f"{action(entry)} wrote {touched} during the upgrade"
