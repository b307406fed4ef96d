"""SnsClient, and a Queue's subscriptions to topics, against moto's server."""

from __future__ import annotations

import json
from dataclasses import replace

import boto3
import pytest

from provisioner.aws import errors
from provisioner.kinds import subscriptions
from provisioner.kinds.contract import PasswordClient
from provisioner.kinds.sns import SnsClient
from provisioner.kinds.sqs import SqsClient

pytestmark = pytest.mark.cloud


@pytest.fixture
def sns(aws):
    return SnsClient(aws)


def _tags(aws, arn):
    return {
        t["Key"]: t["Value"]
        for t in aws.client("sns").list_tags_for_resource(ResourceArn=arn)["Tags"]
    }


def test_lifecycle(aws, sns, make_resource):
    res = make_resource("Topic", {"displayName": "Orders"}, tags={"team": "a"})
    assert sns.observe(res).exists is False
    assert not isinstance(sns, PasswordClient)  # no password capability

    sns.create(res, {})
    obs = sns.observe(res)
    arn = f"arn:aws:sns:us-east-1:123456789012:{res.external_name}"
    assert obs.exists and obs.owned_by(res) and obs.available and obs.arn == arn
    assert obs.diffs == []
    assert obs.connection == {
        "topicArn": arn,
        "topicName": res.external_name,
        "region": "us-east-1",
    }
    assert _tags(aws, arn) == res.desired_tags

    changed = replace(
        res,
        spec=replace(res.spec, display_name="Orders v2"),
        user_tags={"env": "prod"},
    )
    obs = sns.observe(changed)
    assert {d.field for d in obs.diffs} == {"spec.displayName", "tags"}
    sns.update(changed, obs, [d for d in obs.diffs if d.field == "spec.displayName"])
    obs = sns.observe(changed)
    assert [d.field for d in obs.diffs] == ["tags"]  # only the diffs given are written
    sns.update(changed, obs, obs.diffs)
    assert sns.observe(changed).diffs == []
    assert _tags(aws, arn) == changed.desired_tags  # "team" removed, "env" added

    sns.delete(changed, obs)
    assert sns.observe(changed).exists is False
    sns.delete(changed, obs)  # already gone: no error


def test_fifo_topic_name_and_attribute(aws, sns, make_resource):
    res = make_resource("Topic", {"fifo": True})
    assert res.external_name.endswith(".fifo")
    sns.create(res, {})
    attributes = aws.client("sns").get_topic_attributes(TopicArn=sns.topic_arn(res))["Attributes"]
    assert attributes["FifoTopic"] == "true"
    sns.delete(res, sns.observe(res))


def test_foreign_topic_is_a_conflict(aws, sns, make_resource):
    mine = make_resource("Topic", {"topicName": "shared-orders"})
    aws.client("sns").create_topic(
        Name="shared-orders", Tags=[{"Key": "provisioner.dev/owner-uid", "Value": "someone"}]
    )
    obs = sns.observe(mine)
    assert obs.exists and not obs.owned_by(mine) and obs.owner_uid == "someone"
    with pytest.raises(errors.ConflictError):
        sns.create(mine, {})


def test_queue_subscribes_receives_and_unsubscribes(aws, sns, make_resource):
    """The queue policy lets exactly the subscribed topics send; a message published to the
    topic arrives in the queue; removing the entry removes the subscription and our policy
    statement; deleting the queue removes its subscriptions."""
    sqs = SqsClient(aws)
    topic = make_resource("Topic")
    sns.create(topic, {})
    topic_arn = sns.topic_arn(topic)
    spec = {"subscribeTo": [{"topicRef": {"name": "events"}, "rawMessageDelivery": True}]}
    queue = make_resource("Queue", spec)
    assert [d.kind for d in queue.dependencies] == ["Topic"]
    queue = replace(queue, resolved={"topic/events": topic_arn})

    sqs.create(queue, {})
    obs = sqs.observe(queue)
    assert [d.field for d in obs.diffs] == [subscriptions.FIELD]
    sqs.update(queue, obs, obs.diffs)
    obs = sqs.observe(queue)
    assert obs.diffs == []

    policy = json.loads(obs.client_state["attributes"]["Policy"])
    (statement,) = policy["Statement"]
    assert statement["Resource"] == obs.arn
    assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == [topic_arn]

    client = aws.client("sns")
    client.publish(TopicArn=topic_arn, Message="hello")
    url = obs.connection["queueUrl"]
    received = aws.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in received] == ["hello"]  # raw delivery: no SNS envelope

    subs = client.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"]
    assert [s["Endpoint"] for s in subs] == [obs.arn]

    unsubscribed = replace(queue, spec=replace(queue.spec, subscribe_to=()), resolved={})
    obs = sqs.observe(unsubscribed)
    assert [d.field for d in obs.diffs] == [subscriptions.FIELD]
    sqs.update(unsubscribed, obs, obs.diffs)
    obs = sqs.observe(unsubscribed)
    assert obs.diffs == [] and not obs.client_state["attributes"].get("Policy")
    assert client.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"] == []

    sqs.update(queue, sqs.observe(queue), sqs.observe(queue).diffs)  # subscribed again
    assert len(client.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"]) == 1
    sqs.delete(queue, sqs.observe(queue))
    assert client.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"] == []
    sns.delete(topic, sns.observe(topic))


def test_foreign_policy_statements_are_kept(aws, sns, make_resource):
    sqs = SqsClient(aws)
    topic = make_resource("Topic")
    sns.create(topic, {})
    queue = make_resource("Queue", {"subscribeTo": [{"topicRef": {"name": "t"}}]})
    queue = replace(queue, resolved={"topic/t": sns.topic_arn(topic)})
    sqs.create(queue, {})
    obs = sqs.observe(queue)
    foreign = {"Sid": "someone-else", "Effect": "Deny", "Principal": "*", "Action": "sqs:*"}
    aws.client("sqs").set_queue_attributes(
        QueueUrl=obs.connection["queueUrl"],
        Attributes={"Policy": json.dumps({"Version": "2012-10-17", "Statement": [foreign]})},
    )
    obs = sqs.observe(queue)
    sqs.update(queue, obs, obs.diffs)
    policy = json.loads(sqs.observe(queue).client_state["attributes"]["Policy"])
    assert [s["Sid"] for s in policy["Statement"]] == [
        "someone-else",
        subscriptions.STATEMENT_ID,
    ]
    sqs.delete(queue, sqs.observe(queue))
    sns.delete(topic, sns.observe(topic))


# -- encryption and content-based deduplication -------------------------------------------


@pytest.fixture
def kms_key(aws, moto_url):
    """A symmetric key made by moto's KMS: its ARN."""
    kms = boto3.client("kms", endpoint_url=moto_url, region_name="us-east-1")
    return kms.create_key(Description="topic key")["KeyMetadata"]["Arn"]


def _attributes(aws, arn):
    return aws.client("sns").get_topic_attributes(TopicArn=arn)["Attributes"]


def test_kms_topic_read_back_drift_seen_and_key_removed(aws, sns, make_resource, kms_key):
    res = make_resource("Topic", {"kmsKeyId": kms_key})
    created = sns.create(res, {})
    assert created.diffs == []
    obs = sns.observe(res)
    arn = sns.topic_arn(res)
    assert obs.diffs == []
    assert _attributes(aws, arn)["KmsMasterKeyId"] == kms_key
    assert obs.connection["kmsKeyId"] == kms_key
    note = obs.status["kmsKeyPolicy"]
    assert note is not None and kms_key in note
    assert "kms:GenerateDataKey*" in note and "kms:Decrypt" in note

    # Encryption removed behind the operator's back: a diff, put back.
    aws.client("sns").set_topic_attributes(
        TopicArn=arn, AttributeName="KmsMasterKeyId", AttributeValue=""
    )
    obs = sns.observe(res)
    assert [(d.field, d.observed, d.desired) for d in obs.diffs] == [("spec.kmsKeyId", "", kms_key)]
    sns.update(res, obs, obs.diffs)
    assert sns.observe(res).diffs == [] and _attributes(aws, arn)["KmsMasterKeyId"] == kms_key

    assert obs.status["kmsKeyId"] == kms_key  # recorded: the key this operator set

    # The key taken out of the spec (status still records it): encryption off, no key
    # value, no note, no record.
    plain = replace(res, spec=replace(res.spec, kms_key_id=""), status={"kmsKeyId": kms_key})
    obs = sns.observe(plain)
    assert [(d.field, d.desired) for d in obs.diffs] == [("spec.kmsKeyId", "")]
    sns.update(plain, obs, obs.diffs)
    obs = sns.observe(plain)
    assert obs.diffs == [] and "KmsMasterKeyId" not in _attributes(aws, arn)
    assert "kmsKeyId" not in obs.connection and obs.status["kmsKeyPolicy"] is None
    assert obs.status["kmsKeyId"] is None
    sns.delete(plain, obs)


def test_a_key_someone_else_put_on_the_topic_is_left_alone(aws, sns, make_resource, kms_key):
    """Without spec.kmsKeyId and without a key of the operator's own on record, encryption is
    not the operator's: never removed, so the topic is never left less protected."""
    res = make_resource("Topic")
    sns.create(res, {})
    arn = sns.topic_arn(res)
    aws.client("sns").set_topic_attributes(
        TopicArn=arn, AttributeName="KmsMasterKeyId", AttributeValue=kms_key
    )
    obs = sns.observe(res)
    assert obs.diffs == [] and obs.status["kmsKeyId"] is None
    assert _attributes(aws, arn)["KmsMasterKeyId"] == kms_key
    sns.delete(res, obs)


def test_fifo_topic_content_based_deduplication(aws, sns, make_resource):
    res = make_resource("Topic", {"fifo": True, "contentBasedDeduplication": True})
    sns.create(res, {})
    arn = sns.topic_arn(res)
    assert _attributes(aws, arn)["ContentBasedDeduplication"] == "true"
    assert sns.observe(res).diffs == []
    # Publishing without a deduplication id is accepted only with content-based dedup.
    aws.client("sns").publish(TopicArn=arn, Message="m", MessageGroupId="g")

    aws.client("sns").set_topic_attributes(
        TopicArn=arn, AttributeName="ContentBasedDeduplication", AttributeValue="false"
    )
    obs = sns.observe(res)
    assert [(d.field, d.observed, d.desired) for d in obs.diffs] == [
        ("spec.contentBasedDeduplication", False, True)
    ]
    sns.update(res, obs, obs.diffs)
    assert sns.observe(res).diffs == []
    assert _attributes(aws, arn)["ContentBasedDeduplication"] == "true"
    sns.delete(res, obs)


def test_standard_topic_has_no_deduplication_diff(sns, make_resource):
    res = make_resource("Topic", {"contentBasedDeduplication": True})
    sns.create(res, {})
    obs = sns.observe(res)
    assert obs.diffs == [] and obs.status == {"kmsKeyPolicy": None, "kmsKeyId": None}
    sns.delete(res, obs)


def test_queue_with_kms_key_subscribed_to_a_kms_topic(aws, sns, make_resource, kms_key):
    """Both encrypted: the subscription is made, and the queue says what its key must allow."""
    sqs = SqsClient(aws)
    topic = make_resource("Topic", {"kmsKeyId": kms_key})
    sns.create(topic, {})
    topic_arn = sns.topic_arn(topic)
    spec = {
        "encryption": {"type": "KMS", "kmsKeyId": kms_key},
        "subscribeTo": [{"topicRef": {"name": "events"}}],
    }
    queue = replace(make_resource("Queue", spec), resolved={"topic/events": topic_arn})
    sqs.create(queue, {})
    obs = sqs.observe(queue)
    sqs.update(queue, obs, obs.diffs)
    obs = sqs.observe(queue)
    assert obs.diffs == []
    subs = aws.client("sns").list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"]
    assert [s["Endpoint"] for s in subs] == [obs.arn]
    assert "sns.amazonaws.com" in obs.status["kmsKeyPolicy"]
    sqs.delete(queue, obs)
    sns.delete(topic, sns.observe(topic))
