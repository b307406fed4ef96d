"""SqsClient against moto's server."""

from __future__ import annotations

from dataclasses import replace

import boto3
import pytest

from provisioner.aws import errors
from provisioner.aws.session import CALLS
from provisioner.kinds.contract import PasswordClient
from provisioner.kinds.sqs import DEAD_LETTER_ARN, SqsClient
from provisioner.kinds.sqs_attributes import ENCRYPTION_FIELD

pytestmark = pytest.mark.cloud

CONNECTION_KEYS = {"queueUrl", "queueArn", "queueName", "region"}


@pytest.fixture
def sqs(aws):
    return SqsClient(aws)


def _raw_tags(aws, url):
    return aws.client("sqs").list_queue_tags(QueueUrl=url).get("Tags", {})


def test_lifecycle(aws, sqs, make_resource):
    res = make_resource("Queue", tags={"team": "a"})
    name = res.external_name
    assert sqs.observe(res).exists is False

    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.exists and obs.owned_by(res) and obs.available and not obs.deleting
    assert obs.diffs == []
    url = obs.connection["queueUrl"]
    assert _raw_tags(aws, url) == res.desired_tags
    assert set(obs.connection) == CONNECTION_KEYS
    assert obs.connection["queueName"] == name and obs.connection["region"] == "us-east-1"
    assert obs.connection["queueArn"] == obs.arn == f"arn:aws:sqs:us-east-1:123456789012:{name}"
    assert url.endswith(f"/{name}")
    assert obs.status == {"queueUrl": url, "kmsKeyPolicy": None}

    before = CALLS.total()
    sqs.update(res, obs, obs.diffs)  # up to date: no call at all
    assert CALLS.total() == before

    changed = replace(
        res,
        spec=replace(
            res.spec, visibility_timeout_seconds=60, message_retention_seconds=3600, delay_seconds=5
        ),
        user_tags={"env": "test"},
    )
    obs = sqs.observe(changed)
    assert {d.field for d in obs.diffs} == {
        "spec.visibilityTimeoutSeconds",
        "spec.messageRetentionSeconds",
        "spec.delaySeconds",
        "tags",
    }
    sqs.update(changed, obs, obs.diffs)
    assert sqs.observe(changed).diffs == []
    assert _raw_tags(aws, url) == changed.desired_tags  # "team" removed, "env" added

    assert not isinstance(sqs, PasswordClient)  # no password capability

    sqs.delete(changed, obs)
    assert sqs.observe(changed).exists is False
    sqs.delete(changed, obs)  # already gone: success


def test_fifo_queue(sqs, make_resource):
    res = make_resource("Queue", {"fifo": True})
    assert res.external_name.endswith(".fifo")
    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.owned_by(res) and obs.diffs == []
    assert obs.client_state["attributes"]["FifoQueue"] == "true"
    sqs.delete(res, obs)


def test_dead_letter_redrive_set_changed_and_removed(sqs, make_resource):
    dlq = make_resource("Queue", name="dlq")
    sqs.create(dlq, {})
    dlq_arn = sqs.observe(dlq).arn
    res = make_resource(
        "Queue", {"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 3}}
    )

    linked = replace(res, resolved={DEAD_LETTER_ARN: dlq_arn})
    sqs.create(linked, {})
    assert sqs.observe(linked).diffs == []

    more = replace(linked, spec=replace(res.spec, max_receive_count=7))
    obs = sqs.observe(more)
    assert [
        (d.field, d.observed["maxReceiveCount"], d.desired["maxReceiveCount"]) for d in obs.diffs
    ] == [("spec.deadLetter", 3, 7)]
    sqs.update(more, obs, obs.diffs)
    assert sqs.observe(more).diffs == []

    unlinked = replace(more, resolved={})  # no dead letter target wanted any more
    obs = sqs.observe(unlinked)
    assert [(d.field, d.desired) for d in obs.diffs] == [("spec.deadLetter", None)]
    sqs.update(unlinked, obs, obs.diffs)
    obs = sqs.observe(unlinked)
    assert obs.diffs == [] and "RedrivePolicy" not in obs.client_state["attributes"]

    obs = sqs.observe(more)
    sqs.update(more, obs, obs.diffs)  # and set again on an existing queue
    assert sqs.observe(more).diffs == []


def test_foreign_queue_is_observed_not_owned(aws, sqs, make_resource):
    res = make_resource("Queue")
    aws.client("sqs").create_queue(QueueName=res.external_name, Attributes={"DelaySeconds": "9"})
    obs = sqs.observe(res)
    assert obs.exists and obs.owner_uid == "" and not obs.owned_by(res)
    with pytest.raises(errors.ConflictError):  # different attributes: QueueAlreadyExists
        sqs.create(res, {})


# -- encryption, FIFO options, receive wait, maximum size ---------------------------------


@pytest.fixture
def kms_key(aws, moto_url):
    """A symmetric key made by moto's KMS: its ARN."""
    kms = boto3.client("kms", endpoint_url=moto_url, region_name="us-east-1")
    return kms.create_key(Description="queue key")["KeyMetadata"]["Arn"]


def _attributes(aws, url):
    return aws.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["All"])[
        "Attributes"
    ]


def _looked_at(sqs, res):
    """An observation, and how many AWS calls it took."""
    before = CALLS.total()
    obs = sqs.observe(res)
    return obs, CALLS.total() - before


def test_a_new_queue_is_sse_sqs_with_aws_defaults(aws, sqs, make_resource):
    res = make_resource("Queue")
    created = sqs.create(res, {})
    assert created.diffs == []  # the create's own answer: what was written
    obs = sqs.observe(res)
    assert obs.diffs == []
    attrs = _attributes(aws, obs.connection["queueUrl"])
    assert attrs["SqsManagedSseEnabled"] == "true" and "KmsMasterKeyId" not in attrs
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "0"
    assert attrs["MaximumMessageSize"] == "262144"
    assert "kmsKeyId" not in obs.connection
    sqs.delete(res, obs)


def test_kms_queue_read_back_drift_corrected_and_back_to_sse_sqs(aws, sqs, make_resource, kms_key):
    res = make_resource(
        "Queue",
        {"encryption": {"type": "KMS", "kmsKeyId": kms_key, "dataKeyReuseSeconds": 600}},
    )
    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.diffs == []
    url = obs.connection["queueUrl"]
    attrs = _attributes(aws, url)
    assert attrs["KmsMasterKeyId"] == kms_key
    assert attrs["KmsDataKeyReusePeriodSeconds"] == "600"
    assert obs.connection["kmsKeyId"] == kms_key
    assert obs.status["kmsKeyPolicy"] is None  # no subscription: nothing asked of the key

    # Encryption turned off behind the operator's back: one diff, put back in one write.
    aws.client("sqs").set_queue_attributes(
        QueueUrl=url, Attributes={"KmsMasterKeyId": "", "SqsManagedSseEnabled": "false"}
    )
    obs = sqs.observe(res)
    assert [(d.field, d.observed, d.desired) for d in obs.diffs] == [
        (
            ENCRYPTION_FIELD,
            None,
            {"type": "KMS", "kmsKeyId": kms_key, "dataKeyReuseSeconds": 600},
        )
    ]
    sqs.update(res, obs, obs.diffs)
    assert sqs.observe(res).diffs == []
    assert _attributes(aws, url)["KmsMasterKeyId"] == kms_key

    # Another data key reuse period is a diff of the same field.
    aws.client("sqs").set_queue_attributes(
        QueueUrl=url, Attributes={"KmsDataKeyReusePeriodSeconds": "60"}
    )
    obs = sqs.observe(res)
    assert [(d.field, d.observed["dataKeyReuseSeconds"]) for d in obs.diffs] == [
        (ENCRYPTION_FIELD, 60)
    ]

    # The spec asks for SSE-SQS: the key is taken off, SqsManagedSseEnabled set.
    sse_sqs = replace(res, spec=replace(res.spec, settings=make_resource("Queue").spec.settings))
    obs = sqs.observe(sse_sqs)
    assert [(d.field, d.desired) for d in obs.diffs] == [(ENCRYPTION_FIELD, {"type": "SQS"})]
    sqs.update(sse_sqs, obs, obs.diffs)
    attrs = _attributes(aws, url)
    assert attrs["SqsManagedSseEnabled"] == "true" and not attrs.get("KmsMasterKeyId")
    obs = sqs.observe(sse_sqs)
    assert obs.diffs == [] and "kmsKeyId" not in obs.connection
    sqs.delete(sse_sqs, obs)


def test_receive_wait_and_maximum_size_written_and_drift_seen(aws, sqs, make_resource):
    res = make_resource("Queue", {"receiveWaitTimeSeconds": 20, "maximumMessageSizeBytes": 2048})
    sqs.create(res, {})
    obs = sqs.observe(res)
    url = obs.connection["queueUrl"]
    attrs = _attributes(aws, url)
    assert (attrs["ReceiveMessageWaitTimeSeconds"], attrs["MaximumMessageSize"]) == (
        "20",
        "2048",
    )
    # SQS refuses a message over the queue's maximum size.
    with pytest.raises(aws.client("sqs").exceptions.ClientError):
        aws.client("sqs").send_message(QueueUrl=url, MessageBody="x" * 4096)

    aws.client("sqs").set_queue_attributes(
        QueueUrl=url,
        Attributes={"ReceiveMessageWaitTimeSeconds": "3", "MaximumMessageSize": "262144"},
    )
    obs = sqs.observe(res)
    assert sorted((d.field, d.observed, d.desired) for d in obs.diffs) == [
        ("spec.maximumMessageSizeBytes", 262144, 2048),
        ("spec.receiveWaitTimeSeconds", 3, 20),
    ]
    sqs.update(res, obs, obs.diffs)
    assert sqs.observe(res).diffs == []
    sqs.delete(res, obs)


def test_fifo_options_read_back_deduplicate_and_drift_seen(aws, sqs, make_resource, kms_key):
    res = make_resource(
        "Queue",
        {
            "fifo": True,
            "contentBasedDeduplication": True,
            "deduplicationScope": "messageGroup",
            "fifoThroughputLimit": "perMessageGroupId",
            "encryption": {"type": "KMS", "kmsKeyId": kms_key},
        },
    )
    sqs.create(res, {})
    obs, calls = _looked_at(sqs, res)
    assert obs.diffs == []
    # The same calls as for a queue without any of these settings: the attributes come
    # with the one GetQueueAttributes (besides GetQueueUrl without a recorded URL, tags).
    plain = make_resource("Queue", {"fifo": True})
    sqs.create(plain, {})
    assert _looked_at(sqs, plain)[1] == calls == 3
    url = obs.connection["queueUrl"]
    attrs = _attributes(aws, url)
    assert attrs["ContentBasedDeduplication"] == "true"
    assert attrs["DeduplicationScope"] == "messageGroup"
    assert attrs["FifoThroughputLimit"] == "perMessageGroupId"
    assert attrs["KmsDataKeyReusePeriodSeconds"] == "300"  # the default with KMS

    # Content-based deduplication: the same body twice, without a deduplication id, is one.
    client = aws.client("sqs")
    for _ in range(2):
        client.send_message(QueueUrl=url, MessageBody="order 7", MessageGroupId="g")
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert [m["Body"] for m in got["Messages"]] == ["order 7"]

    client.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "ContentBasedDeduplication": "false",
            "DeduplicationScope": "queue",
            "FifoThroughputLimit": "perQueue",
        },
    )
    obs = sqs.observe(res)
    assert sorted((d.field, d.observed, d.desired) for d in obs.diffs) == [
        ("spec.contentBasedDeduplication", False, True),
        ("spec.deduplicationScope", "queue", "messageGroup"),
        ("spec.fifoThroughputLimit", "perQueue", "perMessageGroupId"),
    ]
    sqs.update(res, obs, obs.diffs)
    assert sqs.observe(res).diffs == []
    sqs.delete(res, obs)
    sqs.delete(plain, sqs.observe(plain))


def test_standard_queue_is_never_compared_on_fifo_options(aws, sqs, make_resource):
    """A spec that names FIFO options on a standard queue (a CRD without the rule): SQS
    would refuse them, so they are neither sent nor compared."""
    res = make_resource("Queue", {"contentBasedDeduplication": True})
    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.diffs == []
    assert "ContentBasedDeduplication" not in _attributes(aws, obs.connection["queueUrl"])
    sqs.delete(res, obs)


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab", "sns.amazonaws.com"),
        ("alias/aws/sqs", "SNS cannot deliver to this queue"),
    ],
)
def test_kms_queue_subscribed_says_what_the_key_policy_must_allow(sqs, make_resource, key, said):
    spec = {
        "encryption": {"type": "KMS", "kmsKeyId": key},
        "subscribeTo": [{"topicRef": {"name": "events"}}],
    }
    res = make_resource("Queue", spec)
    sqs.create(res, {})
    obs = sqs.observe(res)
    note = obs.status["kmsKeyPolicy"]
    assert note is not None and said in note and key in note
    assert "kms:GenerateDataKey" in note and "kms:Decrypt" in note
    assert "https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html" in note
    sqs.delete(res, obs)
