"""Day-2 operations: drift, pause, reconcile-now, adoption, password rotation."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import (
    apply,
    condition,
    events,
    get,
    merge_patch,
    secret_data,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

GROUP = "cloud.provisioner.dev"


def manifest(kind: str, name: str, spec: str, annotations: dict[str, str] | None = None) -> str:
    meta = f"  name: {name}\n"
    if annotations:
        meta += "  annotations:\n" + "".join(f'    {k}: "{v}"\n' for k, v in annotations.items())
    return f"apiVersion: {GROUP}/v1alpha1\nkind: {kind}\nmetadata:\n{meta}spec: {spec}\n"


def annotate(kube, kind: str, namespace: str, name: str, key: str, value: str) -> None:
    kube.kubectl("annotate", kind, name, "-n", namespace, "--overwrite", f"{GROUP}/{key}={value}")


def event_messages(kube, namespace: str, name: str, reason: str) -> list[str]:
    return [e["message"] for e in events(kube, namespace, name) if e["reason"] == reason]


def test_drift_is_corrected_and_named(kube, operator, aws, namespace):
    apply(kube, namespace, manifest("S3Bucket", "drifty", "{versioning: true, tags: {team: a}}"))
    bucket = wait_ready(kube, "s3bucket", namespace, "drifty")["status"]["externalName"]
    # Behind the operator's back: versioning suspended, our tags removed.
    aws.s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    aws.s3.delete_bucket_tagging(Bucket=bucket)
    wait_for(
        lambda: aws.s3.get_bucket_versioning(Bucket=bucket).get("Status") == "Enabled",
        timeout=30,
        what="versioning to be turned back on",
    )
    wait_for(
        lambda: "provisioner.dev/owner-uid" in json.dumps(aws.s3.get_bucket_tagging(Bucket=bucket)),
        timeout=30,
        what="the ownership tags to be restored",
    )
    messages = wait_for(
        lambda: event_messages(kube, namespace, "drifty", "Drifted"), what="a Drifted Event"
    )
    assert any("spec.versioning" in m and "False" in m and "True" in m for m in messages)
    cr = wait_condition(kube, "s3bucket", namespace, "drifty", "Drifted", "False", "DriftCorrected")
    assert "spec.versioning" in condition(cr, "Drifted")["message"]


def test_drift_report_only_leaves_the_cloud_alone(kube, operator, aws, namespace):
    apply(
        kube,
        namespace,
        manifest(
            "Queue",
            "watched",
            "{visibilityTimeoutSeconds: 30}",
            {f"{GROUP}/drift-policy": "report"},
        ),
    )
    url = wait_ready(kube, "queue", namespace, "watched")["status"]["queueUrl"]
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99"})
    cr = wait_condition(
        kube, "queue", namespace, "watched", "Drifted", "True", "DriftReported", timeout=30
    )
    assert "spec.visibilityTimeoutSeconds" in condition(cr, "Drifted")["message"]
    assert event_messages(kube, namespace, "watched", "Drifted")
    attrs = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    assert attrs["Attributes"]["VisibilityTimeout"] == "99"
    # Switching the policy off corrects it on the next pass.
    kube.kubectl("annotate", "queue", "watched", "-n", namespace, f"{GROUP}/drift-policy-")
    wait_for(
        lambda: (
            aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])[
                "Attributes"
            ]["VisibilityTimeout"]
            == "30"
        ),
        timeout=30,
        what="the drift to be corrected once reporting is switched off",
    )


def test_paused_makes_no_cloud_calls_and_holds_deletion(kube, operator, aws, namespace):
    apply(kube, namespace, manifest("Queue", "frozen", "{}"))
    cr = wait_ready(kube, "queue", namespace, "frozen")
    name = cr["status"]["externalName"]
    annotate(kube, "queue", namespace, "frozen", "paused", "true")
    wait_condition(kube, "queue", namespace, "frozen", "Synced", "False", "Paused")
    calls = len(kube.cloud_requests(name))
    # Change the spec and delete the CR: still no cloud call while paused.
    merge_patch(kube, "queue", namespace, "frozen", '{"spec":{"delaySeconds":7}}')
    kube.kubectl("delete", "queue", "frozen", "-n", namespace, "--wait=false")
    wait_condition(kube, "queue", namespace, "frozen", "Ready", "False", "Deleting")
    # Meanwhile a neighbour is resynced several times (proof that time passed).
    apply(kube, namespace, manifest("Queue", "neighbour", "{}"))
    neighbour = wait_ready(kube, "queue", namespace, "neighbour")["status"]["externalName"]
    seen = len(kube.cloud_requests(neighbour))
    wait_for(lambda: len(kube.cloud_requests(neighbour)) >= seen + 6, timeout=60, what="resyncs")
    assert len(kube.cloud_requests(name)) == calls
    assert get(kube, "queue", namespace, "frozen") is not None
    # Unpause: the deletion completes.
    annotate(kube, "queue", namespace, "frozen", "paused", "false")
    wait_gone(kube, "queue", namespace, "frozen")
    assert len(kube.cloud_requests(name)) > calls


def test_reconcile_requested_after_a_conflict_is_resolved(kube, operator, aws, namespace):
    taken = f"taken-{namespace}"
    aws.s3.create_bucket(Bucket=taken)
    apply(kube, namespace, manifest("S3Bucket", "later", f"{{bucketName: {taken}}}"))
    wait_condition(kube, "s3bucket", namespace, "later", "Synced", "False", "NameConflict")
    aws.s3.delete_bucket(Bucket=taken)
    annotate(kube, "s3bucket", namespace, "later", "reconcile-requested-at", "now-1")
    cr = wait_ready(kube, "s3bucket", namespace, "later")
    assert cr["status"]["lastReconcileRequest"] == "now-1"


def test_adoption_of_an_untagged_bucket(kube, operator, aws, namespace):
    existing = f"legacy-{namespace}"
    aws.s3.create_bucket(Bucket=existing)
    aws.s3.put_object(Bucket=existing, Key="old.txt", Body=b"history")
    # Its owner in the cloud allows this namespace, and only it, to adopt it.
    aws.s3.put_bucket_tagging(
        Bucket=existing,
        Tagging={"TagSet": [{"Key": "provisioner.dev/adoptable-by", "Value": namespace}]},
    )
    apply(
        kube,
        namespace,
        manifest(
            "S3Bucket",
            "legacy",
            f"{{bucketName: {existing}, versioning: true}}",
            {f"{GROUP}/adopt": "true"},
        ),
    )
    cr = wait_ready(kube, "s3bucket", namespace, "legacy")
    tags = {t["Key"]: t["Value"] for t in aws.s3.get_bucket_tagging(Bucket=existing)["TagSet"]}
    assert tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert aws.s3.get_bucket_versioning(Bucket=existing)["Status"] == "Enabled"
    assert aws.s3.get_object(Bucket=existing, Key="old.txt")["Body"].read() == b"history"
    assert event_messages(kube, namespace, "legacy", "Adopted")


def test_adoption_of_a_foreign_tagged_bucket_is_refused(kube, operator, aws, namespace):
    foreign = f"claimed-{namespace}"
    aws.s3.create_bucket(Bucket=foreign)
    aws.s3.put_bucket_tagging(
        Bucket=foreign,
        Tagging={"TagSet": [{"Key": "provisioner.dev/owner-uid", "Value": "someone-else"}]},
    )
    apply(
        kube,
        namespace,
        manifest("S3Bucket", "grab", f"{{bucketName: {foreign}}}", {f"{GROUP}/adopt": "true"}),
    )
    cr = wait_condition(kube, "s3bucket", namespace, "grab", "Synced", "False", "NameConflict")
    message = condition(cr, "Synced")["message"]
    assert "owned by another resource" in message and "someone-else" not in message
    tags = aws.s3.get_bucket_tagging(Bucket=foreign)["TagSet"]
    assert tags == [{"Key": "provisioner.dev/owner-uid", "Value": "someone-else"}]


def test_without_the_annotation_nothing_is_adopted(kube, operator, aws, namespace):
    existing = f"plain-{namespace}"
    aws.s3.create_bucket(Bucket=existing)
    apply(kube, namespace, manifest("S3Bucket", "plain", f"{{bucketName: {existing}}}"))
    wait_condition(kube, "s3bucket", namespace, "plain", "Synced", "False", "NameConflict")
    with pytest.raises(aws.s3.exceptions.ClientError):
        aws.s3.get_bucket_tagging(Bucket=existing)


def last_password_sent(kube, identifier: str) -> str | None:
    """The MasterUserPassword of the last ModifyDBInstance moto received for `identifier`."""
    found = None
    for request in kube.cloud_requests(identifier):
        if "ModifyDBInstance" in request:
            match = re.search(r"MasterUserPassword=([A-Za-z0-9]+)", request)
            if match:
                found = match.group(1)
    return found


def test_password_rotation_sets_the_cloud_first_then_the_secret(kube, operator, aws, namespace):
    apply(
        kube,
        namespace,
        manifest(
            "DatabaseInstance",
            "rotating",
            "{engine: mysql, instanceClass: db.t3.micro, deletionPolicy: Delete}",
        ),
    )
    cr = wait_ready(kube, "dbi", namespace, "rotating")
    identifier = cr["status"]["externalName"]
    first = secret_data(kube, namespace, "rotating-connection")["password"]
    annotate(kube, "dbi", namespace, "rotating", "rotate-password-at", "2026-01-01T00:00:00Z")
    rotated = wait_for(
        lambda: (
            (d := secret_data(kube, namespace, "rotating-connection"))
            and d["password"] != first
            and d["password"]
        ),
        what="a new password in the Secret",
    )
    assert last_password_sent(kube, identifier) == rotated
    cr = wait_for(
        lambda: (
            (o := get(kube, "dbi", namespace, "rotating"))
            and o["status"].get("lastPasswordRotation") == "2026-01-01T00:00:00Z"
            and o
        ),
        what="the rotation recorded in status",
    )
    assert rotated not in json.dumps(cr)
    assert event_messages(kube, namespace, "rotating", "PasswordChanged")
