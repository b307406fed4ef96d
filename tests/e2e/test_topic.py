"""Topic: create, Secret, change, a Queue subscribed to it receiving what is published, delete."""

from __future__ import annotations

import json

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

TOPIC_KEYS = {"topicArn", "topicName", "region"}


def manifest(kind: str, name: str, spec: str = "{}") -> str:
    return (
        f"apiVersion: cloud.provisioner.dev/v1alpha1\nkind: {kind}\n"
        f"metadata:\n  name: {name}\nspec: {spec}\n"
    )


def topic_exists(aws, arn: str) -> bool:
    try:
        aws.sns.get_topic_attributes(TopicArn=arn)
    except aws.sns.exceptions.NotFoundException:
        return False
    return True


def test_topic_lifecycle(kube, operator, aws, namespace):
    apply(kube, namespace, manifest("Topic", "orders", "{displayName: Orders, tags: {app: web}}"))
    cr = wait_ready(kube, "topic", namespace, "orders")
    arn = cr["status"]["arn"]
    name = cr["status"]["externalName"]
    assert arn.endswith(f":{name}")

    data = secret_data(kube, namespace, "orders-connection")
    assert data == {"topicArn": arn, "topicName": name, "region": "us-east-1"}
    assert aws.sns.get_topic_attributes(TopicArn=arn)["Attributes"]["DisplayName"] == "Orders"
    tags = {t["Key"]: t["Value"] for t in aws.sns.list_tags_for_resource(ResourceArn=arn)["Tags"]}
    assert tags["app"] == "web" and tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]

    listed = kube.kubectl("get", "snst", "-n", namespace).stdout
    assert "orders" in listed and name in listed

    merge_patch(kube, "topic", namespace, "orders", '{"spec": {"displayName": "Orders v2"}}')
    wait_ready(kube, "topic", namespace, "orders", generation=2)
    assert aws.sns.get_topic_attributes(TopicArn=arn)["Attributes"]["DisplayName"] == "Orders v2"
    assert any(e["reason"] == "Updated" for e in events(kube, namespace, "orders"))

    kube.kubectl("delete", "topic", "orders", "-n", namespace)
    wait_gone(kube, "topic", namespace, "orders")
    assert not topic_exists(aws, arn)
    assert secret_data(kube, namespace, "orders-connection") is None


def test_queue_subscribed_to_topic_receives_its_messages(kube, operator, aws, namespace):
    # The queue is applied first: it waits for the Topic to be Ready.
    subscribe = "{subscribeTo: [{topicRef: {name: news}, rawMessageDelivery: true}]}"
    apply(kube, namespace, manifest("Queue", "inbox", subscribe))
    wait_condition(kube, "queue", namespace, "inbox", "Ready", "False", "WaitingForDependency")
    apply(kube, namespace, manifest("Topic", "news"))
    topic = wait_ready(kube, "topic", namespace, "news")
    queue = wait_ready(kube, "queue", namespace, "inbox")

    topic_arn, queue_arn = topic["status"]["arn"], queue["status"]["arn"]
    url = queue["status"]["queueUrl"]
    subs = aws.sns.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"]
    assert [(s["Protocol"], s["Endpoint"]) for s in subs] == [("sqs", queue_arn)]
    policy = json.loads(
        aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"][
            "Policy"
        ]
    )
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Service": "sns.amazonaws.com"}
    assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == [topic_arn]

    aws.sns.publish(TopicArn=topic_arn, Message="order 42 shipped")
    received = wait_for(
        lambda: aws.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages"),
        timeout=30,
        what="the published message in the queue",
    )
    assert [m["Body"] for m in received] == ["order 42 shipped"]

    # Unsubscribing is a spec change: the subscription and our policy statement go.
    merge_patch(kube, "queue", namespace, "inbox", '{"spec": {"subscribeTo": null}}')
    wait_ready(kube, "queue", namespace, "inbox", generation=2)
    assert aws.sns.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"] == []
    attrs = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert not attrs.get("Policy")

    # Subscribed again, then the queue deleted: its subscription does not outlive it.
    resubscribe = {"spec": {"subscribeTo": [{"topicRef": {"name": "news"}}]}}
    merge_patch(kube, "queue", namespace, "inbox", json.dumps(resubscribe))
    wait_ready(kube, "queue", namespace, "inbox", generation=3)
    assert len(aws.sns.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"]) == 1
    kube.kubectl("delete", "queue", "inbox", "-n", namespace)
    wait_gone(kube, "queue", namespace, "inbox")
    assert aws.sns.list_subscriptions_by_topic(TopicArn=topic_arn)["Subscriptions"] == []
    kube.kubectl("delete", "topic", "news", "-n", namespace)
    wait_gone(kube, "topic", namespace, "news")
    assert not topic_exists(aws, topic_arn)
    assert get(kube, "topic", namespace, "news") is None
    assert condition(topic, "Ready")["status"] == "True"
