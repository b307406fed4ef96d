"""spec.region as a tenant writes it: what is no region's name is refused by the CRD, a
well-formed name the operator does not know gets InvalidSpec without one AWS call."""

from __future__ import annotations

import pytest

from tests.conftest import on_moto_only
from tests.helpers import (
    assert_refused,
    condition,
    manifests,
    secret_data,
    try_apply,
    wait_condition,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, on_moto_only]

UNKNOWN = "zz-fake-9"


def tenant(kube, namespace: str) -> str:
    """A user allowed the namespaced kinds in `namespace` and nothing else; its name, for
    kubectl's --as (the suite's kubeconfig may impersonate)."""
    who = f"tenant-{namespace}"
    kube.kubectl(
        "create",
        "role",
        "tenant",
        "-n",
        namespace,
        "--verb=get,list,watch,create,update,patch,delete",
        "--resource=queues.cloud.provisioner.dev,s3buckets.cloud.provisioner.dev",
    )
    kube.kubectl(
        "create", "rolebinding", "tenant", "-n", namespace, "--role=tenant", f"--user={who}"
    )
    return who


def as_tenant(kube, who: str, namespace: str, manifest: str, *flags: str):
    return kube.kubectl(
        "apply", f"--as={who}", *flags, "-n", namespace, "-f", "-", input=manifest, check=False
    )


def requests_naming(kube, text: str) -> list[str]:
    """moto's recorded requests (url, headers, body) that mention `text`: a client of a
    region signs every request with it (the Authorization header's credential scope)."""
    path = kube.moto.record_to
    if path is None or not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if text in line]


@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1"])
def test_what_is_no_regions_name_is_refused_at_apply(kube, namespace, version):
    who = tenant(kube, namespace)
    for region in ("x" * 100, "mars", "us-east-1-", "US-EAST-1"):
        manifest = manifests([("Queue", "q", f"{{region: '{region}'}}")], version=version)
        assert_refused(as_tenant(kube, who, namespace, manifest), "spec.region")
    # A partition's region that the former pattern refused is a region's name.
    fine = manifests([("Queue", "q", "{region: eusc-de-east-1}")], version=version)
    accepted = as_tenant(kube, who, namespace, fine, "--dry-run=server")
    assert accepted.returncode == 0, accepted.stderr


def test_cloud_account_regions_are_checked_too(kube):
    for field in ("regions: ['xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-1']", "defaultRegion: mars"):
        manifest = (
            "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: CloudAccount\n"
            "metadata:\n  name: region-check\n"
            "spec:\n  accountId: '111111111111'\n"
            "  roleArn: arn:aws:iam::111111111111:role/provisioner\n"
            f"  {field}\n"
        )
        result = try_apply(kube, "default", manifest, "--dry-run=server")
        assert_refused(result, "spec.region" if "regions" in field else "spec.defaultRegion")


def test_an_unknown_region_is_invalid_spec_without_an_aws_call(kube, operator, namespace):
    who = tenant(kube, namespace)
    manifest = manifests(
        [("Queue", "far", f"{{region: {UNKNOWN}}}"), ("S3Bucket", "farther", "{region: zz-fake-8}")]
    )
    applied = as_tenant(kube, who, namespace, manifest)
    assert applied.returncode == 0, applied.stderr
    cr = wait_condition(kube, "queue", namespace, "far", "Synced", "False", "InvalidSpec")
    message = condition(cr, "Synced")["message"]
    assert f"spec.region {UNKNOWN}" in message
    assert "externalName" not in cr["status"]
    wait_condition(kube, "s3bucket", namespace, "farther", "Synced", "False", "InvalidSpec")
    assert requests_naming(kube, UNKNOWN) == []
    assert requests_naming(kube, "zz-fake-8") == []

    # The region is immutable once set (a resource cannot move): the fix is a new resource;
    # a refused one deletes at once.
    moved = as_tenant(kube, who, namespace, manifests([("Queue", "far", "{region: eu-west-1}")]))
    assert_refused(moved, "spec.region is immutable once set")
    kube.kubectl("delete", "queue", "far", "-n", namespace, f"--as={who}", "--wait=false")
    wait_gone(kube, "queue", namespace, "far")
    fixed = manifests([("Queue", "far", "{region: eu-west-1}")])
    assert as_tenant(kube, who, namespace, fixed).returncode == 0
    wait_ready(kube, "queue", namespace, "far", timeout=120)
    data = secret_data(kube, namespace, "far-connection")
    assert data is not None and data["region"] == "eu-west-1"
    assert ":eu-west-1:" in data["queueArn"]
    kube.kubectl("delete", "s3bucket", "farther", "-n", namespace, f"--as={who}", "--wait=false")
    wait_gone(kube, "s3bucket", namespace, "farther")
    assert requests_naming(kube, "zz-fake-8") == []
