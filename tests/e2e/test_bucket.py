"""S3Bucket: the life of a bucket as a developer and a platform engineer see it."""

from __future__ import annotations

import boto3
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

BUCKET_KEYS = {"bucket", "region", "arn", "endpoint"}


def bucket_manifest(name: str, **spec: object) -> str:
    lines = [f"  {k}: {v}" for k, v in spec.items()]
    body = "\n".join(lines) if lines else "  {}"
    return (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: S3Bucket\n"
        f"metadata:\n  name: {name}\nspec:\n{body}\n"
    )


def tags_of(aws, bucket: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in aws.s3.get_bucket_tagging(Bucket=bucket)["TagSet"]}


def bucket_exists(aws, bucket: str) -> bool:
    return any(b["Name"] == bucket for b in aws.s3.list_buckets()["Buckets"])


def test_bucket_lifecycle(kube, operator, aws, namespace):
    apply(kube, namespace, bucket_manifest("photos", versioning="true", tags="{team: media}"))
    cr = wait_ready(kube, "s3bucket", namespace, "photos")
    bucket = cr["status"]["externalName"]
    assert cr["status"]["observedGeneration"] == 1
    assert cr["status"]["connectionSecret"] == "photos-connection"

    # The Secret holds exactly the contract's keys, and they work.
    data = secret_data(kube, namespace, "photos-connection")
    assert data is not None and set(data) == BUCKET_KEYS
    assert data["bucket"] == bucket and data["arn"] == f"arn:aws:s3:::{bucket}"
    client = boto3.client(
        "s3",
        endpoint_url=data["endpoint"],
        region_name=data["region"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.put_object(Bucket=data["bucket"], Key="hello.txt", Body=b"hi")
    assert client.get_object(Bucket=data["bucket"], Key="hello.txt")["Body"].read() == b"hi"

    # The cloud resource has the spec's properties and our ownership tags.
    assert aws.s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rules = aws.s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]
    assert rules["Rules"][0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    tags = tags_of(aws, bucket)
    assert tags["team"] == "media"
    assert tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert tags["provisioner.dev/namespace"] == namespace
    assert tags["provisioner.dev/name"] == "photos"
    assert tags["provisioner.dev/cluster"] == "test"

    # A kubectl user sees it.
    table = kube.kubectl("get", "s3b", "-n", namespace).stdout
    assert "photos" in table and bucket in table and "True" in table

    # Change mutable fields: the cloud follows, and so does observedGeneration.
    merge_patch(
        kube,
        "s3bucket",
        namespace,
        "photos",
        '{"spec":{"versioning":false,"tags":{"team":"video"},"lifecycle":{"expireAfterDays":30}}}',
    )
    cr = wait_ready(kube, "s3bucket", namespace, "photos", generation=2)
    assert aws.s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"
    assert tags_of(aws, bucket)["team"] == "video"
    lifecycle = aws.s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert lifecycle[0]["Expiration"]["Days"] == 30
    reasons = [e["reason"] for e in events(kube, namespace, "photos")]
    assert "Created" in reasons and "Updated" in reasons and "Available" in reasons

    # Delete: the objects block deletion until forceDestroy is set.
    kube.kubectl("delete", "s3bucket", "photos", "-n", namespace, "--wait=false")
    cr = wait_condition(kube, "s3bucket", namespace, "photos", "Ready", "False", "Deleting")
    wait_for(
        lambda: (
            "forceDestroy"
            in (condition(get(kube, "s3bucket", namespace, "photos"), "Ready") or {}).get(
                "message", ""
            )
        ),
        what="a deletion message that says how to proceed",
    )
    assert bucket_exists(aws, bucket)
    merge_patch(kube, "s3bucket", namespace, "photos", '{"spec":{"forceDestroy":true}}')
    wait_gone(kube, "s3bucket", namespace, "photos", timeout=60)
    assert not bucket_exists(aws, bucket)
    assert secret_data(kube, namespace, "photos-connection") is None


def test_bucket_name_conflict_leaves_the_foreign_bucket_alone(kube, operator, aws, namespace):
    foreign = f"foreign-{namespace}"
    aws.s3.create_bucket(Bucket=foreign)
    aws.s3.put_object(Bucket=foreign, Key="theirs.txt", Body=b"keep me")
    apply(kube, namespace, bucket_manifest("mine", bucketName=foreign))
    cr = wait_condition(kube, "s3bucket", namespace, "mine", "Synced", "False", "NameConflict")
    assert foreign in condition(cr, "Synced")["message"]
    assert secret_data(kube, namespace, "mine-connection") is None
    kube.kubectl("delete", "s3bucket", "mine", "-n", namespace, "--wait=false")
    wait_gone(kube, "s3bucket", namespace, "mine")
    assert bucket_exists(aws, foreign)
    assert aws.s3.get_object(Bucket=foreign, Key="theirs.txt")["Body"].read() == b"keep me"
    assert "provisioner.dev/owner-uid" not in str(aws.s3.list_objects_v2(Bucket=foreign))
    with pytest.raises(aws.s3.exceptions.ClientError):
        aws.s3.get_bucket_tagging(Bucket=foreign)  # still untagged: never touched


def test_deleted_secret_is_recreated(kube, operator, namespace):
    apply(kube, namespace, bucket_manifest("assets"))
    wait_ready(kube, "s3bucket", namespace, "assets")
    before = secret_data(kube, namespace, "assets-connection")
    kube.kubectl("delete", "secret", "assets-connection", "-n", namespace)
    after = wait_for(
        lambda: secret_data(kube, namespace, "assets-connection"),
        timeout=30,
        what="the connection Secret to be recreated",
    )
    assert after == before


def test_retain_leaves_the_bucket(kube, operator, aws, namespace):
    apply(kube, namespace, bucket_manifest("kept", deletionPolicy="Retain"))
    cr = wait_ready(kube, "s3bucket", namespace, "kept")
    bucket = cr["status"]["externalName"]
    kube.kubectl("delete", "s3bucket", "kept", "-n", namespace, "--wait=false")
    wait_gone(kube, "s3bucket", namespace, "kept")
    assert bucket_exists(aws, bucket)
    assert tags_of(aws, bucket)["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert secret_data(kube, namespace, "kept-connection") is None
