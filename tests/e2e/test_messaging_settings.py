"""Queue and Topic settings through the API server: server-side encryption with a KMS key
(read back with boto3), FIFO high throughput with content-based deduplication, receive wait
and maximum size, drift put back, planned, adopted, the upgrade of a queue last handled
before `spec.encryption` existed, and the refusals at apply time."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from provisioner_dev.awsenv import aws_env
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    merge_patch,
    secret_data,
    try_apply,
    wait_condition,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.e2e

GROUP = "cloud.provisioner.dev"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders-fifo.yaml"
KEY_POLICY_DOCS = "https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html"


def manifest(
    kind: str,
    name: str,
    spec: dict[str, Any],
    version: str = "v1alpha1",
    annotations: dict[str, str] | None = None,
) -> str:
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    body = {"apiVersion": f"{GROUP}/{version}", "kind": kind, "metadata": metadata, "spec": spec}
    return yaml.safe_dump(body)


def kms(kube) -> Any:
    env = aws_env(kube.moto.url)
    return boto3.client(
        "kms",
        endpoint_url=kube.moto.url,
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def new_key(kube, alias: str | None = None) -> str:
    """A symmetric key made by moto's KMS (with `alias`, if not taken yet): its ARN."""
    client = kms(kube)
    arn = client.create_key(Description="messaging settings")["KeyMetadata"]["Arn"]
    if alias:
        taken = {a["AliasName"] for a in client.list_aliases()["Aliases"]}
        if alias not in taken:
            client.create_alias(AliasName=alias, TargetKeyId=arn)
    return arn


def queue_attributes(aws, url: str) -> dict[str, str]:
    return aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def topic_attributes(aws, arn: str) -> dict[str, str]:
    return aws.sns.get_topic_attributes(TopicArn=arn)["Attributes"]


def test_queue_and_topic_with_a_kms_key(kube, operator, aws, namespace):
    key = new_key(kube)
    apply(kube, namespace, manifest("Topic", "events", {"kmsKeyId": key}))
    spec = {
        "encryption": {"type": "KMS", "kmsKeyId": key, "dataKeyReuseSeconds": 900},
        "subscribeTo": [{"topicRef": {"name": "events"}}],
        "connectionSecret": {"keys": {"URL": "{{ .queueUrl }}", "KEY": "{{ .kmsKeyId }}"}},
    }
    apply(kube, namespace, manifest("Queue", "inbox", spec, version="v1beta1"))
    topic = wait_ready(kube, "topic", namespace, "events")
    queue = wait_ready(kube, "queue", namespace, "inbox")

    attrs = queue_attributes(aws, queue["status"]["queueUrl"])
    assert attrs["KmsMasterKeyId"] == key
    assert attrs["KmsDataKeyReusePeriodSeconds"] == "900"
    assert topic_attributes(aws, topic["status"]["arn"])["KmsMasterKeyId"] == key
    assert topic["status"]["kmsKeyId"] == key  # the key the operator set, on record
    subs = aws.sns.list_subscriptions_by_topic(TopicArn=topic["status"]["arn"])
    assert [s["Endpoint"] for s in subs["Subscriptions"]] == [queue["status"]["arn"]]

    # The operator does not own the key: each says what its key policy must allow.
    note = queue["status"]["kmsKeyPolicy"]
    assert key in note and "sns.amazonaws.com" in note and KEY_POLICY_DOCS in note
    assert "kms:GenerateDataKey" in note and "kms:Decrypt" in note
    assert key in topic["status"]["kmsKeyPolicy"]
    assert "kms:GenerateDataKey*" in topic["status"]["kmsKeyPolicy"]

    # The key is a template value (and, without templates, a default key of the topic's).
    assert secret_data(kube, namespace, "inbox-connection") == {
        "URL": queue["status"]["queueUrl"],
        "KEY": key,
    }
    assert secret_data(kube, namespace, "events-connection")["kmsKeyId"] == key

    # Back to SSE-SQS: the key is taken off the queue, its template value is "", the note goes.
    sse_sqs = {"type": "SQS", "kmsKeyId": None, "dataKeyReuseSeconds": None}
    merge_patch(kube, "queue", namespace, "inbox", json.dumps({"spec": {"encryption": sse_sqs}}))
    queue = wait_ready(kube, "queue", namespace, "inbox", generation=2)
    attrs = queue_attributes(aws, queue["status"]["queueUrl"])
    assert attrs["SqsManagedSseEnabled"] == "true" and not attrs.get("KmsMasterKeyId")
    assert "kmsKeyPolicy" not in queue["status"]
    wait_for(
        lambda: (secret_data(kube, namespace, "inbox-connection") or {}).get("KEY") == "",
        what="the Secret's KEY to be empty",
    )


def test_the_fifo_example_is_high_throughput_and_deduplicates(kube, operator, aws, namespace):
    key = new_key(kube, alias="alias/demo-orders")
    kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    queue = wait_ready(kube, "queue", namespace, "demo-orders", timeout=90)
    dlq = wait_ready(kube, "queue", namespace, "demo-orders-dlq")
    url = queue["status"]["queueUrl"]

    attrs = queue_attributes(aws, url)
    assert attrs["FifoQueue"] == "true"
    assert attrs["ContentBasedDeduplication"] == "true"
    assert attrs["DeduplicationScope"] == "messageGroup"
    assert attrs["FifoThroughputLimit"] == "perMessageGroupId"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "20"
    assert attrs["MaximumMessageSize"] == "262144"
    assert attrs["KmsMasterKeyId"] == "alias/demo-orders"
    assert attrs["KmsDataKeyReusePeriodSeconds"] == "3600"
    assert json.loads(attrs["RedrivePolicy"])["deadLetterTargetArn"] == dlq["status"]["arn"]
    assert queue_attributes(aws, dlq["status"]["queueUrl"])["KmsDataKeyReusePeriodSeconds"] == (
        "300"
    )
    assert secret_data(kube, namespace, "demo-orders-connection") == {
        "ORDERS_QUEUE_URL": url,
        "ORDERS_QUEUE_KMS_KEY": "alias/demo-orders",
        "AWS_REGION": "us-east-1",
    }
    assert key.startswith("arn:aws:kms:")

    # Content-based deduplication: the same body twice, no deduplication id, one message.
    for _ in range(2):
        aws.sqs.send_message(QueueUrl=url, MessageBody="order 42", MessageGroupId="customer-7")
    got = aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert [m["Body"] for m in got["Messages"]] == ["order 42"]


def test_out_of_band_changes_are_put_back(kube, operator, aws, namespace):
    spec = {
        "fifo": True,
        "deduplicationScope": "messageGroup",
        "fifoThroughputLimit": "perMessageGroupId",
        "receiveWaitTimeSeconds": 10,
        "maximumMessageSizeBytes": 65536,
    }
    apply(kube, namespace, manifest("Queue", "steady", spec))
    url = wait_ready(kube, "queue", namespace, "steady")["status"]["queueUrl"]
    aws.sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "FifoThroughputLimit": "perQueue",
            "ReceiveMessageWaitTimeSeconds": "0",
            "MaximumMessageSize": "262144",
            "SqsManagedSseEnabled": "false",
        },
    )

    def restored() -> bool:
        attrs = queue_attributes(aws, url)
        return (
            attrs["FifoThroughputLimit"] == "perMessageGroupId"
            and attrs["ReceiveMessageWaitTimeSeconds"] == "10"
            and attrs["MaximumMessageSize"] == "65536"
            and attrs["SqsManagedSseEnabled"] == "true"
        )

    wait_for(restored, what="the queue's settings to be put back")
    drifted = wait_for(
        lambda: [
            e["message"]
            for e in events(kube, namespace, "steady", "Drifted")
            if e["message"].startswith("corrected:")
        ],
        what="a Drifted Event",
    )
    message = " ".join(drifted)
    for field in (
        "spec.fifoThroughputLimit: 'perQueue' -> 'perMessageGroupId'",
        "spec.receiveWaitTimeSeconds: 0 -> 10",
        "spec.maximumMessageSizeBytes: 262144 -> 65536",
        "spec.encryption: None -> {'type': 'SQS'}",
    ):
        assert field in message, message


def test_a_plan_shows_the_new_settings_and_writes_nothing(kube, operator, aws, namespace):
    apply(kube, namespace, manifest("Queue", "planned", {"fifo": True}))
    url = wait_ready(kube, "queue", namespace, "planned")["status"]["queueUrl"]
    key = new_key(kube)
    kube.kubectl("annotate", "queue", "planned", "-n", namespace, f"{GROUP}/plan-only=true")
    change = {
        "encryption": {"type": "KMS", "kmsKeyId": key},
        "contentBasedDeduplication": True,
        "receiveWaitTimeSeconds": 5,
    }
    merge_patch(kube, "queue", namespace, "planned", json.dumps({"spec": change}))
    cr = wait_for(
        lambda: (
            (o := get(kube, "queue", namespace, "planned"))
            and (o["status"].get("plan") or {}).get("generation") == 2
            and o
        ),
        what="the plan of the edit",
    )
    changes = {c["field"]: (c["cloud"], c["spec"]) for c in cr["status"]["plan"]["changes"]}
    assert changes == {
        "spec.encryption": (
            '{"type": "SQS"}',
            json.dumps({"type": "KMS", "kmsKeyId": key, "dataKeyReuseSeconds": 300}),
        ),
        "spec.contentBasedDeduplication": ("false", "true"),
        "spec.receiveWaitTimeSeconds": ("0", "5"),
    }
    attrs = queue_attributes(aws, url)
    assert "KmsMasterKeyId" not in attrs and attrs["ContentBasedDeduplication"] == "false"

    kube.kubectl("annotate", "queue", "planned", "-n", namespace, f"{GROUP}/plan-only-")
    wait_ready(kube, "queue", namespace, "planned", generation=2)
    attrs = queue_attributes(aws, url)
    assert attrs["KmsMasterKeyId"] == key and attrs["ContentBasedDeduplication"] == "true"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "5"


def test_adoption_takes_the_spec_settings(kube, operator, aws, namespace):
    name = f"adopted-{uuid.uuid4().hex[:8]}"
    url = aws.sqs.create_queue(
        QueueName=name,
        Attributes={"SqsManagedSseEnabled": "false", "ReceiveMessageWaitTimeSeconds": "15"},
        tags={"provisioner.dev/adoptable-by": namespace},
    )["QueueUrl"]
    key = new_key(kube)
    spec = {"queueName": name, "encryption": {"type": "KMS", "kmsKeyId": key}}
    apply(kube, namespace, manifest("Queue", "taken", spec, annotations={f"{GROUP}/adopt": "true"}))
    wait_ready(kube, "queue", namespace, "taken")
    attrs = queue_attributes(aws, url)
    assert attrs["KmsMasterKeyId"] == key and attrs["ReceiveMessageWaitTimeSeconds"] == "0"
    assert events(kube, namespace, "taken", "Adopted")
    assert not events(kube, namespace, "taken", "Drifted")  # taking over is no drift


def test_an_upgraded_queue_without_sse_is_drift_not_a_requested_change(
    kube, operator, aws, namespace
):
    """A queue last handled before `spec.encryption` existed: the API server now defaults it
    into the spec, but nobody asked for it. The operator reads its record of the spec last
    handled with the installed CRD's defaults: the queue is not taken for changed, and a queue
    without SSE is drift (kept and reported under `drift-policy: report`, corrected without)."""
    report = {f"{GROUP}/drift-policy": "report"}
    apply(kube, namespace, manifest("Queue", "old", {}, annotations=report))
    url = wait_ready(kube, "queue", namespace, "old")["status"]["queueUrl"]
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    cr = wait_condition(kube, "queue", namespace, "old", "Drifted", "True", "DriftReported")
    assert "spec.encryption: None -> {'type': 'SQS'}" in condition(cr, "Drifted")["message"]

    # The record of the spec last handled, as the release before this field wrote it.
    handled = json.loads(cr["status"]["kopf"]["lastHandledConfiguration"])
    assert handled["spec"].pop("encryption") == {"type": "SQS"}
    patch = {"status": {"kopf": {"lastHandledConfiguration": json.dumps(handled)}}}
    kube.kubectl(
        "patch",
        "queue",
        "old",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    # A label makes a change pass; once kopf has recorded it, that pass is over.
    kube.kubectl("label", "queue", "old", "-n", namespace, "pass=1")

    def label_handled() -> dict[str, Any] | None:
        now = get(kube, "queue", namespace, "old") or {}
        raw = ((now.get("status") or {}).get("kopf") or {}).get("lastHandledConfiguration")
        labels = ((json.loads(raw) if raw else {}).get("metadata") or {}).get("labels") or {}
        return now if labels.get("pass") == "1" else None

    wait_for(label_handled, what="the label to be handled")
    assert queue_attributes(aws, url)["SqsManagedSseEnabled"] == "false"  # report: kept
    assert not events(kube, namespace, "old", "Updated")
    cr = wait_condition(kube, "queue", namespace, "old", "Drifted", "True", "DriftReported")
    assert "spec.encryption" in condition(cr, "Drifted")["message"]

    # Without `report`, the same difference is corrected as drift.
    kube.kubectl("annotate", "queue", "old", "-n", namespace, f"{GROUP}/drift-policy-")
    wait_for(
        lambda: queue_attributes(aws, url)["SqsManagedSseEnabled"] == "true",
        what="SSE-SQS to be written",
    )
    cr = wait_condition(kube, "queue", namespace, "old", "Drifted", "False", "DriftCorrected")
    assert "spec.encryption" in condition(cr, "Drifted")["message"]


# (kind, spec, version, the message kubectl prints); every object is named "bad".
REFUSALS = [
    pytest.param(
        "Queue",
        {"contentBasedDeduplication": True},
        "spec.contentBasedDeduplication is for FIFO queues only (spec.fifo: true)",
        id="fifo-option-on-standard-queue",
    ),
    pytest.param(
        "Queue",
        {"fifo": False, "fifoThroughputLimit": "perQueue"},
        "spec.fifoThroughputLimit is for FIFO queues only (spec.fifo: true)",
        id="throughput-on-standard-queue",
    ),
    pytest.param(
        "Queue",
        {"encryption": {"type": "KMS"}},
        "spec.encryption.kmsKeyId is required with spec.encryption.type KMS",
        id="kms-without-key",
    ),
    pytest.param(
        "Queue",
        {"encryption": {"kmsKeyId": "alias/app"}},
        "spec.encryption.kmsKeyId is set only with spec.encryption.type KMS (SQS takes no key)",
        id="key-with-sse-sqs",
    ),
    pytest.param(
        "Queue",
        {"fifo": True, "fifoThroughputLimit": "perMessageGroupId"},
        "spec.fifoThroughputLimit perMessageGroupId needs spec.deduplicationScope messageGroup"
        " (SQS high throughput for FIFO queues)",
        id="per-group-throughput-without-per-group-scope",
    ),
    pytest.param(
        "Queue",
        {"receiveWaitTimeSeconds": 21},
        "spec.receiveWaitTimeSeconds in body should be less than or equal to 20",
        id="receive-wait-21",
    ),
    pytest.param(
        "Queue",
        {"maximumMessageSizeBytes": 1023},
        "spec.maximumMessageSizeBytes in body should be greater than or equal to 1024",
        id="message-size-under-1024",
    ),
    pytest.param(
        "Topic",
        {"contentBasedDeduplication": True},
        "spec.contentBasedDeduplication is for FIFO topics only (spec.fifo: true)",
        id="deduplication-on-standard-topic",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "message"), REFUSALS)
@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1"])
def test_refused_at_apply_time(kube, namespace, kind, spec, message, version):
    result = try_apply(kube, namespace, manifest(kind, "bad", spec, version=version))
    assert_refused(result, message)
    assert get(kube, kind.lower(), namespace, "bad") is None
