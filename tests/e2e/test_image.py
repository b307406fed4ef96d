"""The operator's image, built from the Dockerfile and run the way a pod runs it.

The image is built with buildah (`make image`; reused when nothing it is built from changed)
and run by runc as uid 65532 on a read-only root filesystem, with a tmpfs at /tmp, a
ServiceAccount token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount and
KUBERNETES_SERVICE_HOST/PORT pointing at the test's API server: the in-cluster configuration
path, as in a pod. The host's network is shared (the API server and moto listen on loopback).

One resource of each kind goes Ready and is deleted, /healthz and /metrics answer, and the
image's root filesystem is the same, file for file, after the run as before it.

Skipped where images cannot be built: not Linux, not root, buildah/mmdebstrap/runc missing,
or (when the image is not built yet) Debian's mirror out of reach.
"""

from __future__ import annotations

import shutil
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner_dev import image, runc
from provisioner_dev.awsenv import aws_env
from provisioner_dev.launch import SERVICE_ACCOUNT_NAMESPACE
from provisioner_dev.processes import free_port
from tests.conftest import TEST_RESYNC_SECONDS, Cluster, shipped_cluster_role_rules
from tests.e2e.test_observability import sample, scrape
from tests.helpers import apply, manifests, secret_data, wait_for, wait_gone, wait_ready

_CACHED = image.cached_image() if image.cannot_build(need_mirror=False) is None else None
# A cold build (the Debian base, then the Dockerfile) takes several minutes on 2 cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300 if _CACHED else 1800)]

KINDS = [
    ("s3bucket", "S3Bucket", "files", "{}"),
    ("queue", "Queue", "jobs", "{}"),
    ("topic", "Topic", "events", "{}"),
    (
        "databaseinstance",
        "DatabaseInstance",
        "db",
        "{engine: postgres, instanceClass: db.t3.micro, allocatedStorageGiB: 20, "
        "deletionPolicy: Delete}",
    ),
]


@pytest.fixture(scope="session")
def operator_image() -> str:
    why = image.cannot_build(need_mirror=_CACHED is None)
    if why:
        pytest.skip(f"cannot build the image here: {why}")
    return image.build(tag_version=False).ref


@pytest.fixture
def rootfs(operator_image: str) -> Iterator[Path]:
    """A fresh working container of the image (its root filesystem as a plain directory)."""
    fs = image.Rootfs(operator_image)
    yield fs.path
    fs.remove()


def service_account_volume(cluster: Cluster, directory: Path) -> Path:
    """token, ca.crt and namespace of a new ServiceAccount bound to the shipped ClusterRole."""
    kubeconfig = cluster.stack.service_account_kubeconfig(
        "provisioner-image", shipped_cluster_role_rules()
    )
    token = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]["token"]
    directory.mkdir(mode=0o755)
    (directory / "token").write_text(token)
    if cluster.stack.endpoint.write_ca(directory / "ca.crt") is None:
        pytest.skip("the cluster's kubeconfig has no CA: in-cluster configuration needs one")
    (directory / "namespace").write_text(SERVICE_ACCOUNT_NAMESPACE)
    for f in directory.iterdir():
        f.chmod(0o644)
    return directory


def test_image_runs_as_a_pod_would(
    operator_image: str, rootfs: Path, cluster: Cluster, own_namespace: str, aws
) -> None:
    kube, own = cluster, own_namespace
    work = cluster.dir / f"image-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    work.chmod(0o755)
    config = image.image_config(operator_image)

    # What the image holds: the operator, and no dev harness, tests or test tools.
    assert config.get("User") == "65532", config.get("User")
    assert image.unwanted(rootfs) == []
    assert (image.site_packages(rootfs) / "provisioner").is_dir()

    liveness, metrics = free_port(), free_port()
    api = urllib.parse.urlsplit(cluster.stack.endpoint.server)
    # No kubeconfig anywhere in the container: only the in-cluster configuration can work.
    env = {
        "KUBERNETES_SERVICE_HOST": api.hostname or "",
        "KUBERNETES_SERVICE_PORT": str(api.port or 443),
        "PROVISIONER_CLUSTER_ID": own,
        **aws_env(cluster.moto.url),
    }
    args = [
        f"--liveness-port={liveness}",
        f"--metrics-port={metrics}",
        f"--namespace={own}",
        f"--resync-seconds={TEST_RESYNC_SECONDS}",
        # The session's webhook keeps serving the shared CRDs (the node test has the image
        # serve its own, in a pod).
        "--webhook=off",
    ]
    sa = service_account_volume(cluster, work / "serviceaccount")
    assert not any(e.startswith("KUBECONFIG=") for e in config.get("Env") or [])
    container = runc.RuncContainer(f"provisioner-{own}", work / "bundle", work / "operator.log")
    container.create(runc.runc_config(rootfs, config, args, env, sa))
    # runc has made its mount points; from here on the root filesystem must not change.
    before = runc.tree_state(rootfs)
    status = None
    try:
        container.start()
        state = container.state()
        assert state and state["status"] == "running", container.log_tail()
        proc = Path(f"/proc/{state['pid']}/status").read_text()
        assert "\nUid:\t65532\t65532\t65532\t65532\n" in proc, proc

        wait_for(
            lambda: _http_ok(f"http://127.0.0.1:{liveness}/healthz"),
            timeout=60,
            what=f"the container's /healthz; its log:\n{container.log_tail()}",
        )
        apply(kube, own, manifests([(kind, name, spec) for _, kind, name, spec in KINDS]))
        for resource, _, name, _ in KINDS:
            wait_ready(kube, resource, own, name, timeout=120)
            assert secret_data(kube, own, f"{name}-connection"), name
        bucket = kube.kubectl("get", "s3bucket", "files", "-n", own, "-o", "yaml").stdout
        bucket_name = yaml.safe_load(bucket)["status"]["externalName"]
        tags = aws.s3.get_bucket_tagging(Bucket=bucket_name)["TagSet"]
        assert {"Key": "provisioner.dev/cluster", "Value": own} in tags

        samples = scrape(metrics)
        for _, kind, _, _ in KINDS:
            assert sample(samples, "provisioner_reconcile_total", kind=kind, result="success") >= 1

        for resource, _, name, _ in KINDS:
            kube.kubectl("delete", resource, name, "-n", own, "--wait=false")
        for resource, _, name, _ in KINDS:
            wait_gone(kube, resource, own, name, timeout=120)
        assert bucket_name not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]
        assert _http_ok(f"http://127.0.0.1:{liveness}/healthz"), container.log_tail()
    finally:
        status = container.stop()
    assert status == "stopped", f"not stopped by SIGTERM: {status}\n{container.log_tail()}"

    after = runc.tree_state(rootfs)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert changed == [], f"written outside /tmp: {changed[:10]}"
    text = container.log.read_text(errors="replace")
    assert "Read-only file system" not in text, container.log_tail()
    assert 'forbidden: User "' not in text, "the shipped RBAC refused the operator"
    assert "MasterUserPassword" not in text


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            return bool(resp.status == 200)
    except OSError:
        return False


def test_image_tag_follows_what_it_is_built_from(tmp_path: Path) -> None:
    """The image's tag (the cache key) changes with a file the build reads, not with bytecode."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in image.CONTEXT_FILES:
        shutil.copy(image.ROOT / name, tree / name)
    for d in image.CONTEXT_DIRS:
        shutil.copytree(image.ROOT / d, tree / d)
    base = image.base_ref()
    key = image.context_key(base)
    assert image.context_key(base, tree) == key
    (tree / "provisioner" / "__pycache__").mkdir(exist_ok=True)
    (tree / "provisioner" / "__pycache__" / "extra.cpython-311.pyc").write_bytes(b"\0")
    assert image.context_key(base, tree) == key
    (tree / "provisioner" / "__init__.py").write_text("# changed\n", encoding="utf-8")
    assert image.context_key(base, tree) != key
    assert image.context_key("localhost/provisioner-base:other", tree) != key
