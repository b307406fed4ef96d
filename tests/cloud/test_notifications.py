"""S3Bucket.spec.notifications (provisioner/kinds/notifications.py) against moto's server: the
statement in each target's policy beside everyone else's, the bucket's configuration beside
everyone else's, both removed, drift seen, a FIFO target refused, no call without them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace

import boto3
import pytest

from provisioner.aws import errors
from provisioner.aws.session import CALLS
from provisioner.kinds import keys, notifications, subscriptions
from provisioner.kinds.s3 import S3Client
from provisioner.kinds.sns import SnsClient
from provisioner.kinds.sqs import SqsClient
from provisioner.model.resource import Resource

pytestmark = pytest.mark.cloud

ACCOUNT = "123456789012"
CREATED = ["s3:ObjectCreated:*"]
# Someone else's statement in a queue's policy, and someone else's configuration on a bucket.
FOREIGN_SID = "team-audit"


@pytest.fixture
def s3(aws):
    return S3Client(aws)


def _calls() -> Counter[str]:
    return Counter({op: n for (_, op, _), n in CALLS.counts.items()})


def _queue(aws, make_resource, spec=None):
    """A Queue made by its own client: (resource, url, arn)."""
    res = make_resource("Queue", spec or {})
    obs = SqsClient(aws).create(res, {})
    return res, obs.status["queueUrl"], obs.arn


def _topic(aws, make_resource):
    res = make_resource("Topic")
    return SnsClient(aws).create(res, {}).arn


def _queue_policy(aws, url) -> dict:
    attributes = aws.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    text = attributes.get("Attributes", {}).get("Policy")
    return json.loads(text) if text else {}


def _topic_policy(aws, arn) -> dict:
    return json.loads(aws.client("sns").get_topic_attributes(TopicArn=arn)["Attributes"]["Policy"])


def _sids(policy: dict) -> list[str]:
    return sorted(s.get("Sid", "") for s in policy.get("Statement", []))


def _foreign_statement(arn: str) -> dict:
    return {
        "Sid": FOREIGN_SID,
        "Effect": "Allow",
        "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
        "Action": "sqs:ReceiveMessage",
        "Resource": arn,
    }


def _bucket(s3, make_resource, entries, resolved):
    res = replace(make_resource("S3Bucket", {"notifications": entries}), resolved=resolved)
    s3.create(res, {})
    return res


def _configuration(aws, bucket) -> dict:
    answer = aws.client("s3").get_bucket_notification_configuration(Bucket=bucket)
    return {k: v for k, v in answer.items() if k != "ResponseMetadata"}


def _ids(configuration: dict) -> dict[str, list[str]]:
    return {k: sorted(c["Id"] for c in v) for k, v in configuration.items() if v}


@dataclass
class World:
    """A bucket notifying a queue (with someone else's statement in its policy) and a topic,
    with someone else's configuration for another queue; nothing of ours written yet."""

    res: Resource
    url: str
    queue_arn: str
    other_url: str
    other_arn: str
    topic_arn: str
    foreign: dict
    before_topic: dict


@pytest.fixture
def world(aws, s3, make_resource) -> World:
    _, url, queue_arn = _queue(aws, make_resource)
    _, other_url, other_arn = _queue(aws, make_resource)
    topic_arn = _topic(aws, make_resource)
    foreign = {"Version": "2012-10-17", "Statement": [_foreign_statement(queue_arn)]}
    aws.client("sqs").set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(foreign)})
    entries = [
        {"queueRef": {"name": "inbox"}, "events": CREATED, "prefix": "in/"},
        {"topicRef": {"name": "news"}, "events": CREATED, "prefix": "news/", "suffix": ".json"},
    ]
    resolved = {"notify/queue/inbox": queue_arn, "notify/topic/news": topic_arn}
    res = _bucket(s3, make_resource, entries, resolved)
    theirs = {"Id": "theirs", "QueueArn": other_arn, "Events": ["s3:ObjectRemoved:*"]}
    aws.client("s3").put_bucket_notification_configuration(
        Bucket=res.external_name, NotificationConfiguration={"QueueConfigurations": [theirs]}
    )
    before_topic = _topic_policy(aws, topic_arn)
    return World(res, url, queue_arn, other_url, other_arn, topic_arn, foreign, before_topic)


def test_statements_and_configurations_are_put_beside_others(aws, s3, world):
    bucket, sid = world.res.external_name, notifications.statement_id(world.res.external_name)
    obs = s3.observe(world.res)
    assert [d.field for d in obs.diffs] == [notifications.FIELD]
    # Recorded before anything is put: the reconciler writes this first.
    targets = sorted([world.queue_arn, world.topic_arn])
    assert obs.status == {
        "notifications": [{"targetArn": a, "statementId": sid} for a in targets],
        "kmsKeyPolicy": None,  # no target is encrypted with a KMS key
    }
    s3.update(world.res, obs, obs.diffs)

    policy = _queue_policy(aws, world.url)
    assert _sids(policy) == sorted([FOREIGN_SID, sid])
    (ours,) = [s for s in policy["Statement"] if s["Sid"] == sid]
    assert ours["Principal"] == {"Service": "s3.amazonaws.com"}
    assert ours["Action"] == "sqs:SendMessage" and ours["Resource"] == world.queue_arn
    assert ours["Condition"] == {
        "ArnEquals": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"},
        "StringEquals": {"aws:SourceAccount": ACCOUNT},
    }
    topic_policy = _topic_policy(aws, world.topic_arn)
    assert _sids(topic_policy) == sorted([*_sids(world.before_topic), sid])
    (published,) = [s for s in topic_policy["Statement"] if s["Sid"] == sid]
    assert published["Action"] == "sns:Publish" and published["Resource"] == world.topic_arn
    configuration = _configuration(aws, bucket)
    queues = {c["Id"]: c for c in configuration["QueueConfigurations"]}
    assert queues.pop("theirs")["QueueArn"] == world.other_arn  # kept as it was
    (mine,) = queues.values()
    assert mine["Id"].startswith("provisioner-") and mine["QueueArn"] == world.queue_arn
    assert mine["Events"] == CREATED
    (topic_config,) = configuration["TopicConfigurations"]
    rules = {r["Name"].lower(): r["Value"] for r in topic_config["Filter"]["Key"]["FilterRules"]}
    assert topic_config["TopicArn"] == world.topic_arn
    assert rules == {"prefix": "news/", "suffix": ".json"}
    assert s3.observe(world.res).diffs == []


def test_a_removed_entry_and_the_deleted_bucket_take_only_what_is_ours(aws, s3, world):
    obs = s3.observe(world.res)
    s3.update(world.res, obs, obs.diffs)
    res, bucket = world.res, world.res.external_name
    sid = notifications.statement_id(bucket)
    topic_id = _ids(_configuration(aws, bucket))["TopicConfigurations"]

    # The queue's entry removed: its configuration, then its statement; the rest stays.
    fewer = replace(res, spec=replace(res.spec, notifications=res.spec.notifications[1:]))
    fewer = replace(fewer, status={"notifications": obs.status["notifications"]})
    obs = s3.observe(fewer)
    assert [d.field for d in obs.diffs] == [notifications.FIELD]
    recorded = [e["targetArn"] for e in obs.status["notifications"]]
    assert recorded == sorted([world.queue_arn, world.topic_arn])
    s3.update(fewer, obs, obs.diffs)
    assert _queue_policy(aws, world.url) == world.foreign
    assert _ids(_configuration(aws, bucket)) == {
        "QueueConfigurations": ["theirs"],
        "TopicConfigurations": topic_id,
    }
    obs = s3.observe(fewer)
    assert obs.diffs == []
    assert obs.status == {
        "notifications": [{"targetArn": world.topic_arn, "statementId": sid}],
        "kmsKeyPolicy": None,
    }

    # Deleting the bucket takes its statement out of every target it recorded.
    gone = replace(fewer, spec=replace(fewer.spec, force_destroy=True), status=obs.status)
    s3.delete(gone, s3.observe(gone))
    assert _topic_policy(aws, world.topic_arn) == world.before_topic
    assert _queue_policy(aws, world.url) == world.foreign
    assert _queue_policy(aws, world.other_url) == {}


def test_a_removed_statement_or_configuration_is_drift_and_put_back(aws, s3, make_resource):
    _, url, queue_arn = _queue(aws, make_resource)
    entries = [{"queueRef": {"name": "inbox"}, "events": CREATED}]
    res = _bucket(s3, make_resource, entries, {"notify/queue/inbox": queue_arn})
    obs = s3.observe(res)
    s3.update(res, obs, obs.diffs)
    res = replace(res, status={"notifications": s3.observe(res).status["notifications"]})
    sid = notifications.statement_id(res.external_name)

    aws.client("sqs").set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    obs = s3.observe(res)
    (diff,) = obs.diffs
    assert diff.observed["statements"] == [] and diff.desired["statements"] == [queue_arn]
    assert diff.observed["configurations"] == diff.desired["configurations"]
    s3.update(res, obs, obs.diffs)
    assert _sids(_queue_policy(aws, url)) == [sid]

    aws.client("s3").put_bucket_notification_configuration(
        Bucket=res.external_name, NotificationConfiguration={}
    )
    (diff,) = s3.observe(res).diffs
    assert diff.observed["configurations"] == [] and diff.observed["statements"] == [queue_arn]
    before = _calls()
    s3.update(res, s3.observe(res), [diff])
    written = _calls() - before
    # The statement is there: only the configuration is written.
    assert written["PutBucketNotificationConfiguration"] == 1
    assert written["SetQueueAttributes"] == 0
    assert s3.observe(res).diffs == []


def test_the_queues_own_subscription_statement_and_the_buckets_keep_each_other(
    aws, s3, make_resource
):
    topic_arn = _topic(aws, make_resource)
    spec = {"subscribeTo": [{"topicRef": {"name": "news"}}]}
    queue, url, queue_arn = _queue(aws, make_resource, spec)
    queue = replace(queue, resolved={"topic/news": topic_arn})
    sqs = SqsClient(aws)
    obs = sqs.observe(queue)
    entries = [{"queueRef": {"name": "inbox"}, "events": CREATED}]
    res = _bucket(s3, make_resource, entries, {"notify/queue/inbox": queue_arn})
    bucket_obs = s3.observe(res)
    s3.update(res, bucket_obs, bucket_obs.diffs)
    sid = notifications.statement_id(res.external_name)
    # The queue writes its subscription statement from what it read before the bucket's:
    # its writer re-reads the policy, so the bucket's statement stays.
    sqs.update(queue, obs, obs.diffs)
    assert _sids(_queue_policy(aws, url)) == sorted([sid, subscriptions.STATEMENT_ID])
    # And the bucket's writer keeps the queue's.
    aws.client("sqs").set_queue_attributes(
        QueueUrl=url,
        Attributes={"Policy": json.dumps({"Statement": [_foreign_statement(queue_arn)]})},
    )
    sqs_obs = sqs.observe(queue)
    sqs.update(queue, sqs_obs, sqs_obs.diffs)
    bucket_obs = s3.observe(res)
    s3.update(res, bucket_obs, bucket_obs.diffs)
    assert _sids(_queue_policy(aws, url)) == sorted([sid, subscriptions.STATEMENT_ID, FOREIGN_SID])
    assert sqs.observe(queue).diffs == [] and s3.observe(res).diffs == []


def test_a_fifo_target_is_refused_before_any_call(aws, s3, make_resource):
    _, _, fifo_arn = _queue(aws, make_resource, {"fifo": True})
    entries = [
        {"topicRef": {"name": "news"}, "events": CREATED},
        {"queueRef": {"name": "jobs"}, "events": CREATED},
    ]
    res = make_resource("S3Bucket", {"notifications": entries})
    topic = f"arn:aws:sns:us-east-1:{ACCOUNT}:news"
    res = replace(res, resolved={"notify/topic/news": topic, "notify/queue/jobs": fifo_arn})
    before = CALLS.total()
    with pytest.raises(errors.TerminalError) as refused:
        s3.observe(res)
    assert CALLS.total() == before
    assert str(refused.value).startswith("spec.notifications[1]: Queue jobs is FIFO")


def test_a_bucket_without_notifications_costs_no_call_for_them(aws, s3, make_resource):
    res = make_resource("S3Bucket")
    s3.create(res, {})
    before = _calls()
    obs = s3.observe(res)
    looked = _calls() - before
    assert "GetBucketNotificationConfiguration" not in looked
    assert obs.status == {} and obs.diffs == []
    # One recorded (a removed entry not cleaned up yet) is looked at.
    recorded = {"notifications": [{"targetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:gone"}]}
    before = _calls()
    obs = s3.observe(replace(res, status=recorded))
    assert (_calls() - before)["GetBucketNotificationConfiguration"] == 1
    # Its queue does not exist: nothing holds a statement, and the record goes.
    assert obs.diffs == [] and obs.status == {"notifications": None, "kmsKeyPolicy": None}


def test_a_target_encrypted_with_a_kms_key_says_what_its_key_must_allow_s3(
    aws, s3, make_resource, moto_url
):
    """S3 encrypts what it sends with the target's key: the bucket's status names the key and
    what its policy must allow, with no call beyond the look's own."""
    kms = boto3.client("kms", endpoint_url=moto_url, region_name="us-east-1")
    key = kms.create_key(Description="target key")["KeyMetadata"]["Arn"]
    _, _, queue_arn = _queue(aws, make_resource, {"encryption": {"type": "KMS", "kmsKeyId": key}})
    _, _, plain_arn = _queue(aws, make_resource)
    entries = [
        {"queueRef": {"name": "sealed"}, "events": CREATED, "prefix": "a/"},
        {"queueRef": {"name": "plain"}, "events": CREATED, "prefix": "b/"},
    ]
    resolved = {"notify/queue/sealed": queue_arn, "notify/queue/plain": plain_arn}
    res = _bucket(s3, make_resource, entries, resolved)
    note = s3.observe(res).status["kmsKeyPolicy"]
    assert note is not None and f"the key policy of {key} (of {queue_arn})" in note
    assert "s3.amazonaws.com" in note and "kms:GenerateDataKey and kms:Decrypt" in note
    assert plain_arn not in note
    assert "AWS managed key" in keys.notification_note({queue_arn: "alias/aws/sqs"})
