"""Nobody reaches what is not theirs, and no password leaves its Secret."""

from __future__ import annotations

import re
import uuid

import pytest

from provisioner.model.connection_secret import PASSWORD_LENGTH
from tests.helpers import (
    apply,
    condition,
    secret_data,
    wait_condition,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.e2e


def every_password_the_cloud_saw(kube) -> set[str]:
    """Every master password the operator generated and sent (its length, its alphabet);
    not `ManageMasterUserPassword=true` or a password a test sent itself."""
    found: set[str] = set()
    pattern = rf"(?<![A-Za-z])MasterUserPassword=([A-Za-z0-9]{{{PASSWORD_LENGTH}}})(?![A-Za-z0-9])"
    for request in kube.cloud_requests("MasterUserPassword"):
        found.update(re.findall(pattern, request))
    return found


def test_no_password_in_logs_events_or_status(kube, operator, namespace):
    db = (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: DatabaseInstance\n"
        "metadata:\n  name: {name}\nspec: {{engine: postgres, instanceClass: db.t3.micro, "
        "deletionPolicy: Delete}}\n"
    )
    apply(kube, namespace, db.format(name="secretive") + "---\n" + db.format(name="rotated"))
    wait_ready(kube, "dbi", namespace, "secretive")
    wait_ready(kube, "dbi", namespace, "rotated")
    first = secret_data(kube, namespace, "rotated-connection")["password"]
    kube.kubectl(
        "annotate",
        "dbi",
        "rotated",
        "-n",
        namespace,
        "cloud.provisioner.dev/rotate-password-at=sec-1",
    )
    kube.kubectl("delete", "secret", "secretive-connection", "-n", namespace)
    wait_for(
        lambda: (
            (d := secret_data(kube, namespace, "rotated-connection")) and d["password"] != first
        ),
        what="the rotation",
    )
    wait_for(lambda: secret_data(kube, namespace, "secretive-connection"), what="the reset")

    passwords = every_password_the_cloud_saw(kube)
    assert len(passwords) >= 4  # two creations, one rotation, one reset (and other tests')
    haystacks = {
        "operator logs": "\n".join(
            p.read_text(errors="replace") for p in kube.dir.glob("operator*.log")
        ),
        "Events": kube.kubectl("get", "events", "-A", "-o", "json").stdout,
        "custom resources": kube.kubectl("get", "cloud", "-A", "-o", "json").stdout,
    }
    for where, text in haystacks.items():
        leaked = [p for p in passwords if p in text]
        assert not leaked, f"{len(leaked)} password(s) found in {where}"


def test_secret_cannot_be_written_into_another_namespace(kube, operator, namespace):
    other = f"t-other-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", other)
    try:
        manifest = (
            "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: S3Bucket\n"
            "metadata:\n  name: sneaky\n"
            f"spec:\n  writeConnectionSecretToRef: {{name: loot, namespace: {other}}}\n"
        )
        strict = kube.kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
        assert strict.returncode != 0 and "unknown field" in strict.stderr
        # Without client-side validation the API server prunes the field: still our namespace.
        kube.kubectl("apply", "--validate=false", "-n", namespace, "-f", "-", input=manifest)
        wait_ready(kube, "s3bucket", namespace, "sneaky")
        assert secret_data(kube, namespace, "loot") is not None
        assert secret_data(kube, other, "loot") is None
    finally:
        kube.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_a_cr_cannot_take_over_another_crs_secret(kube, operator, namespace):
    apply(
        kube,
        namespace,
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: owner\n"
        "spec:\n  writeConnectionSecretToRef: {name: shared}\n",
    )
    wait_ready(kube, "queue", namespace, "owner")
    before = secret_data(kube, namespace, "shared")
    apply(
        kube,
        namespace,
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: thief\n"
        "spec:\n  writeConnectionSecretToRef: {name: shared}\n",
    )
    cr = wait_condition(kube, "queue", namespace, "thief", "Synced", "False", "ReconcileError")
    assert "not owned" in condition(cr, "Synced")["message"]
    assert secret_data(kube, namespace, "shared") == before
    # A hand-made Secret of that name is just as safe.
    kube.kubectl("create", "secret", "generic", "mine", "-n", namespace, "--from-literal=k=v")
    apply(
        kube,
        namespace,
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: S3Bucket\nmetadata:\n  name: grabber\n"
        "spec:\n  writeConnectionSecretToRef: {name: mine}\n",
    )
    wait_condition(kube, "s3bucket", namespace, "grabber", "Synced", "False", "ReconcileError")
    assert secret_data(kube, namespace, "mine") == {"k": "v"}


def test_user_tags_cannot_claim_ownership(kube, operator, namespace):
    refused = kube.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=(
            "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: forged\n"
            'spec:\n  tags: {"provisioner.dev/owner-uid": "someone-else"}\n'
        ),
        check=False,
    )
    assert refused.returncode != 0 and "reserved" in refused.stderr
