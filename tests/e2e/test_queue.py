"""Queue: create, use, change, dead-letter dependencies, cloud-side refusals, delete."""

from __future__ import annotations

import json

import boto3
import pytest

from tests.conftest import on_moto_only
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

QUEUE_KEYS = {"queueUrl", "queueArn", "queueName", "region"}


def queue_manifest(name: str, spec: str = "{}") -> str:
    return (
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: Queue\n"
        f"metadata:\n  name: {name}\nspec: {spec}\n"
    )


def attributes(aws, url: str) -> dict[str, str]:
    return aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def queue_exists(aws, name: str) -> bool:
    try:
        aws.sqs.get_queue_url(QueueName=name)
    except aws.sqs.exceptions.QueueDoesNotExist:
        return False
    return True


def test_queue_lifecycle(kube, operator, aws, namespace):
    apply(
        kube, namespace, queue_manifest("jobs", "{visibilityTimeoutSeconds: 45, tags: {app: web}}")
    )
    cr = wait_ready(kube, "queue", namespace, "jobs")
    name = cr["status"]["externalName"]

    data = secret_data(kube, namespace, "jobs-connection")
    assert data is not None and set(data) == QUEUE_KEYS
    assert data["queueName"] == name and cr["status"]["queueUrl"] == data["queueUrl"]
    user = boto3.client(
        "sqs",
        endpoint_url=kube.moto.url,
        region_name=data["region"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    user.send_message(QueueUrl=data["queueUrl"], MessageBody="hello")
    received = user.receive_message(QueueUrl=data["queueUrl"], WaitTimeSeconds=1)
    assert received["Messages"][0]["Body"] == "hello"

    attrs = attributes(aws, data["queueUrl"])
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["MessageRetentionPeriod"] == "345600"
    assert attrs["QueueArn"] == data["queueArn"]
    tags = aws.sqs.list_queue_tags(QueueUrl=data["queueUrl"])["Tags"]
    assert tags["app"] == "web" and tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]

    merge_patch(
        kube,
        "queue",
        namespace,
        "jobs",
        '{"spec":{"visibilityTimeoutSeconds":120,"delaySeconds":5,"tags":{"app":"api"}}}',
    )
    wait_ready(kube, "queue", namespace, "jobs", generation=2)
    attrs = attributes(aws, data["queueUrl"])
    assert attrs["VisibilityTimeout"] == "120" and attrs["DelaySeconds"] == "5"
    assert aws.sqs.list_queue_tags(QueueUrl=data["queueUrl"])["Tags"]["app"] == "api"

    kube.kubectl("delete", "queue", "jobs", "-n", namespace, "--wait=false")
    wait_gone(kube, "queue", namespace, "jobs")
    assert not queue_exists(aws, name)
    assert secret_data(kube, namespace, "jobs-connection") is None


def test_dead_letter_queue_waits_for_its_target(kube, operator, aws, namespace):
    apply(
        kube,
        namespace,
        queue_manifest(
            "orders", "{deadLetter: {queueRef: {name: orders-dlq}, maxReceiveCount: 3}}"
        ),
    )
    cr = wait_condition(
        kube, "queue", namespace, "orders", "Ready", "False", "WaitingForDependency"
    )
    assert "orders-dlq" in condition(cr, "Ready")["message"]
    assert secret_data(kube, namespace, "orders-connection") is None

    # The target appears later; the dependent proceeds by itself.
    apply(kube, namespace, queue_manifest("orders-dlq"))
    dlq = wait_ready(kube, "queue", namespace, "orders-dlq")
    cr = wait_ready(kube, "queue", namespace, "orders", timeout=90)
    redrive = json.loads(attributes(aws, cr["status"]["queueUrl"])["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["status"]["arn"]
    assert int(redrive["maxReceiveCount"]) == 3
    assert "WaitingForDependency" in [e["reason"] for e in events(kube, namespace, "orders")]


@on_moto_only
def test_cloud_refusal_is_invalid_spec_and_stops_calling(kube, operator, aws, namespace):
    """A FIFO queue cannot dead-letter into a standard queue: only the cloud knows."""
    apply(kube, namespace, queue_manifest("std-dlq"))
    wait_ready(kube, "queue", namespace, "std-dlq")
    apply(
        kube,
        namespace,
        queue_manifest("fifo-main", "{fifo: true, deadLetter: {queueRef: {name: std-dlq}}}"),
    )
    cr = wait_condition(kube, "queue", namespace, "fifo-main", "Synced", "False", "InvalidSpec")
    message = condition(cr, "Synced")["message"]
    assert "non fifo dead letter" in message.lower()
    wait_for(
        lambda: [e for e in events(kube, namespace, "fifo-main") if e["reason"] == "InvalidSpec"],
        what="an InvalidSpec Event",
    )
    name = cr["status"]["externalName"]
    calls_before = len(kube.cloud_requests(name))
    transition = condition(cr, "Synced")["lastTransitionTime"]
    # Let the healthy neighbour be re-checked by three resyncs: the refused queue,
    # meanwhile, gets not one more cloud call for this generation.
    neighbour = get(kube, "queue", namespace, "std-dlq")["status"]["externalName"]
    seen = len(kube.cloud_requests(neighbour))
    wait_for(
        # each resync observes with two calls (attributes and tags, on the URL in status)
        lambda: len(kube.cloud_requests(neighbour)) >= seen + 6,
        timeout=60,
        what="three resyncs of the neighbouring queue",
    )
    assert len(kube.cloud_requests(name)) == calls_before
    cr = get(kube, "queue", namespace, "fifo-main")
    assert condition(cr, "Synced")["lastTransitionTime"] == transition

    # Fixing the spec (a FIFO dead-letter queue) makes it proceed.
    apply(kube, namespace, queue_manifest("fifo-dlq", "{fifo: true}"))
    wait_ready(kube, "queue", namespace, "fifo-dlq")
    merge_patch(
        kube,
        "queue",
        namespace,
        "fifo-main",
        '{"spec":{"deadLetter":{"queueRef":{"name":"fifo-dlq"}}}}',
    )
    wait_ready(kube, "queue", namespace, "fifo-main")
    assert len(kube.cloud_requests(name)) > calls_before
