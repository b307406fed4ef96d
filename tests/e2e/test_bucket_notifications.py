"""S3Bucket.spec.notifications through the API server: a bucket notifying a Queue and a Topic
(and, through the Topic, a Queue subscribed to it), the statements and configurations beside
everyone else's, removal, deletion, a target deleted meanwhile, a FIFO target, what the API
server refuses, plan-only, drift, and crashes in the middle."""

from __future__ import annotations

import json
from urllib.parse import unquote_plus

import pytest

from tests.e2e.test_crash_safety import wait_killed
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    manifests,
    merge_patch,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

CREATED = "[s3:ObjectCreated:*]"
SUBSCRIBED = "{subscribeTo: [{topicRef: {name: news}}]}"
FOREIGN_SID = "team-audit"
TOPIC_SID = "provisioner-topic-subscriptions"


def bucket(name: str, notifications: str, extra: str = "") -> str:
    return manifests([("S3Bucket", name, f"{{{extra}notifications: {notifications}}}")])


def sid_of(bucket_name: str) -> str:
    return f"provisioner-s3-notifications-{bucket_name}"


def queue_policy(aws, url: str) -> dict:
    attributes = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    text = attributes.get("Attributes", {}).get("Policy")
    return json.loads(text) if text else {}


def topic_policy(aws, arn: str) -> dict:
    return json.loads(aws.sns.get_topic_attributes(TopicArn=arn)["Attributes"]["Policy"])


def by_sid(policy: dict) -> dict[str, dict]:
    return {s.get("Sid", ""): s for s in policy.get("Statement", [])}


def ours_in_bucket(aws, name: str) -> dict[str, list[dict]]:
    """The operator's configurations on the bucket, by kind of target."""
    answer = aws.s3.get_bucket_notification_configuration(Bucket=name)
    return {
        key: [c for c in answer.get(key, []) if c["Id"].startswith("provisioner-")]
        for key in ("QueueConfigurations", "TopicConfigurations")
    }


def recorded(cr: dict | None) -> list[str]:
    return [e["targetArn"] for e in ((cr or {}).get("status") or {}).get("notifications") or []]


class Inbox:
    """The object keys of the S3 events a queue received, directly or through a topic."""

    def __init__(self, aws, url: str) -> None:
        self.aws, self.url = aws, url
        self.keys: list[str] = []

    def receive(self) -> list[str]:
        answer = self.aws.sqs.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        for message in answer.get("Messages", []):
            body = json.loads(message["Body"])
            if body.get("Type") == "Notification":  # through SNS: its envelope
                body = json.loads(body["Message"])
            records = body.get("Records", [])  # none in S3's s3:TestEvent
            self.keys += [unquote_plus(r["s3"]["object"]["key"]) for r in records]
            self.aws.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
        return self.keys

    def wait_for(self, key: str) -> None:
        wait_for(lambda: key in self.receive(), timeout=30, what=f"an S3 event for {key}")


def add_foreign_statement(aws, queue: dict) -> dict:
    """Someone else's statement in the queue's policy, beside what is there; the policy."""
    policy = queue_policy(aws, queue["queueUrl"]) or {"Version": "2012-10-17", "Statement": []}
    policy["Statement"].append(
        {
            "Sid": FOREIGN_SID,
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{queue['arn'].split(':')[4]}:root"},
            "Action": "sqs:ReceiveMessage",
            "Resource": queue["arn"],
        }
    )
    attributes = {"Policy": json.dumps(policy)}
    aws.sqs.set_queue_attributes(QueueUrl=queue["queueUrl"], Attributes=attributes)
    return queue_policy(aws, queue["queueUrl"])


def assert_allowed(statement: dict, target: str, bucket_arn: str, action: str) -> None:
    """S3 may `action` on `target` from that bucket of the target's account only."""
    assert statement["Principal"] == {"Service": "s3.amazonaws.com"}
    assert statement["Action"] == action and statement["Resource"] == target
    assert statement["Condition"] == {
        "ArnEquals": {"aws:SourceArn": bucket_arn},
        "StringEquals": {"aws:SourceAccount": target.split(":")[4]},
    }


def test_a_bucket_notifies_a_queue_until_its_entry_goes(kube, operator, aws, namespace):
    apply(kube, namespace, manifests([("Queue", "inbox", "{}"), ("Queue", "other", "{}")]))
    inbox = wait_ready(kube, "queue", namespace, "inbox")["status"]
    other = wait_ready(kube, "queue", namespace, "other")["status"]
    before = add_foreign_statement(aws, inbox)
    notify = (
        f"[{{queueRef: {{name: inbox}}, events: {CREATED}, prefix: direct/}},"
        f" {{queueRef: {{name: other}}, events: {CREATED}, prefix: marker/}}]"
    )
    apply(kube, namespace, bucket("uploads", notify, "forceDestroy: true, "))
    cr = wait_ready(kube, "s3bucket", namespace, "uploads")
    name, bucket_arn = cr["status"]["externalName"], cr["status"]["arn"]
    assert recorded(cr) == sorted([inbox["arn"], other["arn"]])
    statements = by_sid(queue_policy(aws, inbox["queueUrl"]))
    assert set(statements) == {FOREIGN_SID, sid_of(name)}
    assert_allowed(statements[sid_of(name)], inbox["arn"], bucket_arn, "sqs:SendMessage")
    configured = [c["QueueArn"] for c in ours_in_bucket(aws, name)["QueueConfigurations"]]
    assert sorted(configured) == sorted([inbox["arn"], other["arn"]])
    received, marked = Inbox(aws, inbox["queueUrl"]), Inbox(aws, other["queueUrl"])
    aws.s3.put_object(Bucket=name, Key="direct/report 1.csv", Body=b"1")
    received.wait_for("direct/report 1.csv")

    # The inbox's entry removed: its configuration and its statement go, the rest stays.
    rest = {"queueRef": {"name": "other"}, "events": ["s3:ObjectCreated:*"], "prefix": "marker/"}
    patch = json.dumps({"spec": {"notifications": [rest]}})
    merge_patch(kube, "s3bucket", namespace, "uploads", patch)
    cr = wait_ready(kube, "s3bucket", namespace, "uploads", generation=2)
    assert recorded(cr) == [other["arn"]]
    assert queue_policy(aws, inbox["queueUrl"]) == before
    configured = [c["QueueArn"] for c in ours_in_bucket(aws, name)["QueueConfigurations"]]
    assert configured == [other["arn"]]
    # Delivery stopped: a put under direct/ reaches nobody, while one put after it under
    # marker/ still reaches the other queue.
    aws.s3.put_object(Bucket=name, Key="direct/late.csv", Body=b"2")
    aws.s3.put_object(Bucket=name, Key="marker/after.txt", Body=b"3")
    marked.wait_for("marker/after.txt")
    assert "direct/late.csv" not in received.receive()

    # Deleting the bucket leaves every policy as it was before the bucket.
    kube.kubectl("delete", "s3bucket", "uploads", "-n", namespace)
    wait_gone(kube, "s3bucket", namespace, "uploads")
    assert queue_policy(aws, inbox["queueUrl"]) == before
    assert queue_policy(aws, other["queueUrl"]) == {}


def test_a_bucket_notifies_a_topic_and_the_queues_subscribed_to_it(kube, operator, aws, namespace):
    apply(
        kube,
        namespace,
        manifests(
            [
                ("Topic", "news", "{}"),
                ("Queue", "inbox", SUBSCRIBED),
                ("Queue", "fanout", SUBSCRIBED),
            ]
        ),
    )
    topic_arn = wait_ready(kube, "topic", namespace, "news")["status"]["arn"]
    inbox = wait_ready(kube, "queue", namespace, "inbox")["status"]
    fanout = wait_ready(kube, "queue", namespace, "fanout")["status"]
    before_inbox, before_topic = add_foreign_statement(aws, inbox), topic_policy(aws, topic_arn)
    assert set(by_sid(before_inbox)) == {TOPIC_SID, FOREIGN_SID}
    notify = (
        f"[{{topicRef: {{name: news}}, events: {CREATED}, prefix: fanout/}},"
        f" {{queueRef: {{name: inbox}}, events: {CREATED}, prefix: direct/}}]"
    )
    apply(kube, namespace, bucket("fanned", notify, "forceDestroy: true, "))
    cr = wait_ready(kube, "s3bucket", namespace, "fanned")
    name, bucket_arn = cr["status"]["externalName"], cr["status"]["arn"]
    sid = sid_of(name)
    assert recorded(cr) == sorted([inbox["arn"], topic_arn])
    # The queue's own subscription statement, someone else's and the bucket's, side by side.
    statements = by_sid(queue_policy(aws, inbox["queueUrl"]))
    assert set(statements) == {TOPIC_SID, FOREIGN_SID, sid}
    assert_allowed(statements[sid], inbox["arn"], bucket_arn, "sqs:SendMessage")
    assert_allowed(by_sid(topic_policy(aws, topic_arn))[sid], topic_arn, bucket_arn, "sns:Publish")
    assert [c["TopicArn"] for c in ours_in_bucket(aws, name)["TopicConfigurations"]] == [topic_arn]

    # One put reaches both queues through the topic; another the inbox directly.
    received, fanned = Inbox(aws, inbox["queueUrl"]), Inbox(aws, fanout["queueUrl"])
    aws.s3.put_object(Bucket=name, Key="fanout/photo.jpg", Body=b"1")
    fanned.wait_for("fanout/photo.jpg")
    received.wait_for("fanout/photo.jpg")
    aws.s3.put_object(Bucket=name, Key="direct/report.csv", Body=b"2")
    received.wait_for("direct/report.csv")

    # Deleting the bucket leaves every policy as it was before the bucket.
    kube.kubectl("delete", "s3bucket", "fanned", "-n", namespace)
    wait_gone(kube, "s3bucket", namespace, "fanned")
    assert queue_policy(aws, inbox["queueUrl"]) == before_inbox
    assert topic_policy(aws, topic_arn) == before_topic


def test_a_target_deleted_meanwhile_is_waited_for(kube, operator, aws, namespace):
    apply(kube, namespace, manifests([("Queue", "drop", "{}")]))
    first_arn = wait_ready(kube, "queue", namespace, "drop")["status"]["arn"]
    apply(kube, namespace, bucket("watched", f"[{{queueRef: {{name: drop}}, events: {CREATED}}}]"))
    cr = wait_ready(kube, "s3bucket", namespace, "watched")
    assert recorded(cr) == [first_arn]

    kube.kubectl("delete", "queue", "drop", "-n", namespace)
    wait_gone(kube, "queue", namespace, "drop")
    cr = wait_condition(
        kube, "s3bucket", namespace, "watched", "Ready", "False", "WaitingForDependency"
    )
    assert condition(cr, "Ready")["message"] == "waiting for notification Queue drop to be Ready"

    # Back (a new queue, a new ARN): the bucket follows, and forgets the old one.
    apply(kube, namespace, manifests([("Queue", "drop", "{}")]))
    second_arn = wait_ready(kube, "queue", namespace, "drop")["status"]["arn"]
    assert second_arn != first_arn

    def following() -> dict | None:
        found = get(kube, "s3bucket", namespace, "watched")
        ready = condition(found, "Ready") or {}
        return found if ready.get("status") == "True" and recorded(found) == [second_arn] else None

    cr = wait_for(following, what="the bucket notifying the new queue")
    name = cr["status"]["externalName"]
    assert [c["QueueArn"] for c in ours_in_bucket(aws, name)["QueueConfigurations"]] == [second_arn]


def test_a_fifo_queue_is_refused_naming_the_entry(kube, operator, aws, namespace):
    apply(kube, namespace, manifests([("Queue", "jobs", "{fifo: true}")]))
    jobs = wait_ready(kube, "queue", namespace, "jobs")["status"]
    apply(
        kube, namespace, bucket("fifo-target", f"[{{queueRef: {{name: jobs}}, events: {CREATED}}}]")
    )
    cr = wait_condition(
        kube, "s3bucket", namespace, "fifo-target", "Synced", "False", "InvalidSpec"
    )
    message = condition(cr, "Synced")["message"]
    assert "spec.notifications[0]: Queue jobs is FIFO" in message, message
    assert wait_for(lambda: events(kube, namespace, "fifo-target", "InvalidSpec"))
    # Refused before any cloud call: no bucket, no statement.
    names = [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]
    assert cr["status"]["externalName"] not in names
    assert queue_policy(aws, jobs["queueUrl"]) == {}

    merge_patch(kube, "s3bucket", namespace, "fifo-target", '{"spec": {"notifications": null}}')
    wait_ready(kube, "s3bucket", namespace, "fifo-target", generation=2)


@pytest.mark.parametrize(
    ("notifications", "message"),
    [
        (
            "[{queueRef: {name: a}, topicRef: {name: b}, events: [s3:ObjectCreated:*]}]",
            "spec.notifications: an entry names exactly one target, queueRef or topicRef",
        ),
        (
            "[{events: [s3:ObjectCreated:*]}]",
            "spec.notifications: an entry names exactly one target, queueRef or topicRef",
        ),
        (
            "[{queueRef: {name: a}, events: []}]",
            "spec.notifications[0].events: Invalid value: 0: spec.notifications[0].events in "
            "body should have at least 1 items",
        ),
        ("[{queueRef: {name: a}}]", "spec.notifications[0].events: Required value"),
        (
            "[{queueRef: {name: a}, events: [s3:ObjectCreated]}]",
            'spec.notifications[0].events[0]: Unsupported value: "s3:ObjectCreated"',
        ),
        (
            "[{queueRef: {name: a}, events: [s3:ObjectRemoved:*, s3:ObjectRemoved:*]}]",
            "spec.notifications[0].events[1]: Duplicate value",
        ),
        (
            "[" + ", ".join(["{queueRef: {name: a}, events: [s3:ObjectCreated:*]}"] * 21) + "]",
            "spec.notifications: Too many: 21: must have at most 20 items",
        ),
    ],
)
def test_the_api_server_refuses_what_cannot_be_a_notification(
    kube, namespace, notifications, message
):
    assert_refused(try_apply(kube, namespace, bucket("refused", notifications)), message)


def test_plan_only_shows_them_and_drift_is_put_back(kube, operator, aws, namespace):
    apply(kube, namespace, manifests([("Queue", "inbox", "{}"), ("S3Bucket", "planned", "{}")]))
    inbox = wait_ready(kube, "queue", namespace, "inbox")["status"]
    name = wait_ready(kube, "s3bucket", namespace, "planned")["status"]["externalName"]
    kube.kubectl(
        "annotate", "s3bucket", "planned", "-n", namespace, "cloud.provisioner.dev/plan-only=true"
    )
    notify = {"queueRef": {"name": "inbox"}, "events": ["s3:ObjectRemoved:*"]}
    merge_patch(
        kube, "s3bucket", namespace, "planned", json.dumps({"spec": {"notifications": [notify]}})
    )

    def planned() -> dict | None:
        plan = (get(kube, "s3bucket", namespace, "planned") or {}).get("status", {}).get("plan")
        return plan if plan and plan.get("generation") == 2 else None

    plan = wait_for(planned, what="a plan of generation 2")
    assert plan["action"] == "Update"
    (change,) = plan["changes"]
    assert change["field"] == "spec.notifications"
    assert json.loads(change["cloud"]) == {"configurations": [], "statements": []}
    assert json.loads(change["spec"])["statements"] == [inbox["arn"]]
    assert ours_in_bucket(aws, name)["QueueConfigurations"] == []  # nothing written
    assert sid_of(name) not in by_sid(queue_policy(aws, inbox["queueUrl"]))

    kube.kubectl(
        "annotate", "s3bucket", "planned", "-n", namespace, "cloud.provisioner.dev/plan-only-"
    )
    wait_ready(kube, "s3bucket", namespace, "planned", generation=2)
    assert sid_of(name) in by_sid(queue_policy(aws, inbox["queueUrl"]))

    # Someone removes the statement, then the configuration: each look puts it back.
    aws.sqs.set_queue_attributes(QueueUrl=inbox["queueUrl"], Attributes={"Policy": ""})
    wait_for(
        lambda: sid_of(name) in by_sid(queue_policy(aws, inbox["queueUrl"])),
        what="the statement put back",
    )
    aws.s3.put_bucket_notification_configuration(Bucket=name, NotificationConfiguration={})
    wait_for(
        lambda: ours_in_bucket(aws, name)["QueueConfigurations"],
        what="the configuration put back",
    )
    drifted = events(kube, namespace, "planned", "Drifted")
    assert drifted and all("spec.notifications" in e["message"] for e in drifted)


def test_a_crash_after_the_statement_leaves_it_recorded_for_the_next_pass(
    kube, aws, own_namespace, start_operator
):
    first = start_operator()
    apply(kube, own_namespace, manifests([("Queue", "inbox", "{}")]))
    inbox = wait_ready(kube, "queue", own_namespace, "inbox")["status"]
    first.stop()
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "notifications-after-statements"})
    apply(
        kube, own_namespace, bucket("crashy", f"[{{queueRef: {{name: inbox}}, events: {CREATED}}}]")
    )
    wait_killed(doomed)
    cr = get(kube, "s3bucket", own_namespace, "crashy")
    name = cr["status"]["externalName"]
    # Killed between the statement and the configuration; the record came first.
    assert sid_of(name) in by_sid(queue_policy(aws, inbox["queueUrl"]))
    assert ours_in_bucket(aws, name)["QueueConfigurations"] == []
    assert recorded(cr) == [inbox["arn"]]

    # The entry is removed while no operator runs: the record still finds the statement.
    merge_patch(kube, "s3bucket", own_namespace, "crashy", '{"spec": {"notifications": null}}')
    start_operator()
    cr = wait_ready(kube, "s3bucket", own_namespace, "crashy", generation=2)
    assert queue_policy(aws, inbox["queueUrl"]) == {}
    assert recorded(cr) == []


def test_a_crash_between_configuration_and_statement_is_finished_by_the_next_pass(
    kube, aws, own_namespace, start_operator
):
    first = start_operator()
    apply(kube, own_namespace, manifests([("Queue", "inbox", "{}")]))
    inbox = wait_ready(kube, "queue", own_namespace, "inbox")["status"]
    apply(
        kube,
        own_namespace,
        bucket("halfway", f"[{{queueRef: {{name: inbox}}, events: {CREATED}}}]"),
    )
    name = wait_ready(kube, "s3bucket", own_namespace, "halfway")["status"]["externalName"]
    first.stop()
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "notifications-after-configuration"})
    merge_patch(kube, "s3bucket", own_namespace, "halfway", '{"spec": {"notifications": null}}')
    wait_killed(doomed)
    # Killed after the configuration went, before the statement did.
    assert ours_in_bucket(aws, name)["QueueConfigurations"] == []
    assert sid_of(name) in by_sid(queue_policy(aws, inbox["queueUrl"]))

    start_operator()
    cr = wait_ready(kube, "s3bucket", own_namespace, "halfway", generation=2)
    assert queue_policy(aws, inbox["queueUrl"]) == {}
    assert recorded(cr) == []
