"""The periodic resync describes the databases that come due together in one call per batch
(DescribeDBInstances with a db-instance-id filter of up to 100), and still finds and corrects
drift from that answer."""

from __future__ import annotations

import botocore.exceptions
import pytest

from provisioner_dev.processes import free_port
from tests.e2e.test_observability import sample, scrape
from tests.helpers import apply, events, manifests, wait_for, wait_ready

pytestmark = pytest.mark.e2e

DB = "{engine: postgres, instanceClass: db.t3.micro, deletionPolicy: Delete}"


def test_resync_observes_databases_in_batches_and_corrects_drift(
    kube, aws, own_namespace, start_operator
):
    port = free_port()
    # A resync every 10 s: its batch window is 1 s.
    start_operator(args=[f"--metrics-port={port}", "--resync-seconds=10"])
    names = [f"db{i}" for i in range(8)]
    apply(kube, own_namespace, manifests([("DatabaseInstance", n, DB) for n in names]))
    idents = {
        n: wait_ready(kube, "dbi", own_namespace, n, timeout=120)["status"]["externalName"]
        for n in names
    }

    def counts(samples: dict[str, float]) -> tuple[float, float, float]:
        return (
            sample(samples, "provisioner_resync_batched_total", kind="DatabaseInstance"),
            sample(samples, "provisioner_resync_batches_total", kind="DatabaseInstance"),
            sample(
                samples,
                "provisioner_aws_calls_total",
                service="rds",
                operation="DescribeDBInstances",
            ),
        )

    described0, batches0, calls0 = counts(scrape(port))
    # Two periods' worth: every database resynced about twice.
    after = wait_for(
        lambda: (c := counts(scrape(port)))[0] - described0 >= 2 * len(names) and c,
        timeout=90,
        what="two rounds of batched resyncs",
    )
    described, batches, calls = (
        a - b for a, b in zip(after, (described0, batches0, calls0), strict=True)
    )
    print(
        f"\n{described:.0f} resync observations of databases from {batches:.0f} batches; "
        f"DescribeDBInstances calls meanwhile: {calls:.0f}"
    )
    # Without batches it would be one call per observation.
    assert calls <= described / 2, (described, batches, calls)

    # Drift behind the operator's back is still seen from a batch's answer and corrected.
    ident = idents["db3"]
    aws.rds.modify_db_instance(
        DBInstanceIdentifier=ident, BackupRetentionPeriod=30, ApplyImmediately=True
    )

    def retention() -> int:
        found = aws.rds.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
        return int(found["BackupRetentionPeriod"])

    assert retention() == 30
    wait_for(lambda: retention() == 7, timeout=60, what="the drift to be corrected")
    drifted = [e for e in events(kube, own_namespace, "db3") if e["reason"] == "Drifted"]
    assert drifted and "backupRetentionDays" in drifted[-1]["message"], drifted


# The per-resource tag read a look at each kind makes without batches.
TAG_READS = {
    "Queue": ("sqs", "ListQueueTags"),
    "Topic": ("sns", "ListTagsForResource"),
    "S3Bucket": ("s3", "GetBucketTagging"),
}
# The read each look makes whatever the batches (the kind's own attributes).
OWN_READS = {
    "Queue": ("sqs", "GetQueueAttributes"),
    "Topic": ("sns", "GetTopicAttributes"),
    "S3Bucket": ("s3", "HeadBucket"),
}
SHORT = {"Queue": "queue", "Topic": "topic", "S3Bucket": "s3bucket"}


def test_resync_reads_tags_of_queues_topics_and_buckets_in_batches(
    kube, aws, own_namespace, start_operator
):
    """Looks at queues, topics and buckets read their tags with one GetResources per batch:
    no ListQueueTags, ListTagsForResource or GetBucketTagging of their own. A tag changed in
    the cloud is still put back, and a topic deleted in the cloud is made again."""
    port = free_port()
    start_operator(args=[f"--metrics-port={port}", "--resync-seconds=10"])
    n = 4
    crs = [(kind, f"{SHORT[kind]}{i}") for kind in TAG_READS for i in range(n)]
    spec = "{tags: {team: blue}}"
    apply(kube, own_namespace, manifests([(kind, name, spec) for kind, name in crs]))
    ready = {
        (kind, name): wait_ready(kube, SHORT[kind], own_namespace, name, timeout=120)
        for kind, name in crs
    }

    def counts() -> dict[str, float]:
        samples = scrape(port)
        found = {
            "GetResources": sample(
                samples, "provisioner_aws_calls_total", service="resourcegroupstaggingapi"
            )
        }
        for kind in TAG_READS:
            found[f"{kind} batched"] = sample(
                samples, "provisioner_resync_batched_total", kind=kind
            )
            for what, (service, operation) in (("tags", TAG_READS[kind]), ("own", OWN_READS[kind])):
                found[f"{kind} {what}"] = sample(
                    samples, "provisioner_aws_calls_total", service=service, operation=operation
                )
        return found

    before = counts()
    # Two periods' worth: every resource looked at about twice, each from a batch.
    after = wait_for(
        lambda: (
            (c := counts())
            and all(c[f"{k} batched"] - before[f"{k} batched"] >= 2 * n for k in TAG_READS)
            and c
        ),
        timeout=90,
        what="two rounds of resyncs with batched tags",
    )
    looked = {kind: after[f"{kind} batched"] - before[f"{kind} batched"] for kind in TAG_READS}
    # The passes of the last batch run right after it: each look makes its own read.
    after = wait_for(
        lambda: (
            (c := counts())
            and all(c[f"{k} own"] - before[f"{k} own"] >= looked[k] for k in TAG_READS)
            and c
        ),
        timeout=30,
        what="every batched look's own read",
    )
    delta = {key: after[key] - before[key] for key in after}
    print("\ncalls during two rounds of resyncs:", {k: int(v) for k, v in delta.items()})
    for kind in TAG_READS:
        # Each look made its own read, and none read its tags by itself.
        assert delta[f"{kind} own"] >= looked[kind], (kind, delta)
        assert delta[f"{kind} tags"] == 0, (kind, delta)
    looks = sum(delta[f"{kind} batched"] for kind in TAG_READS)
    # One GetResources per kind and batch (moto pages its answers by about 24 resources
    # of these: still one page for a batch here), far fewer than the looks.
    assert delta["GetResources"] <= looks / 2, delta

    # A tag changed in the cloud behind the operator's back: found from the batch's answer,
    # confirmed by the service's own read, put back.
    queue = ready[("Queue", "queue1")]["status"]
    topic_arn = ready[("Topic", "topic1")]["status"]["arn"]
    bucket = ready[("S3Bucket", "s3bucket1")]["status"]["externalName"]
    aws.sqs.tag_queue(QueueUrl=queue["queueUrl"], Tags={"team": "red"})
    aws.sns.tag_resource(ResourceArn=topic_arn, Tags=[{"Key": "team", "Value": "red"}])
    bucket_tags = aws.s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    aws.s3.put_bucket_tagging(
        Bucket=bucket,
        Tagging={"TagSet": [t for t in bucket_tags if t["Key"] != "team"]},
    )

    def teams() -> tuple[str, str, str]:
        sqs_tags = aws.sqs.list_queue_tags(QueueUrl=queue["queueUrl"]).get("Tags") or {}
        sns_tags = aws.sns.list_tags_for_resource(ResourceArn=topic_arn)["Tags"]
        s3_tags = aws.s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
        return (
            sqs_tags.get("team", ""),
            next((t["Value"] for t in sns_tags if t["Key"] == "team"), ""),
            next((t["Value"] for t in s3_tags if t["Key"] == "team"), ""),
        )

    assert teams() == ("red", "red", "")
    wait_for(lambda: teams() == ("blue", "blue", "blue"), timeout=60, what="the tags put back")
    for kind, name in (("Queue", "queue1"), ("Topic", "topic1"), ("S3Bucket", "s3bucket1")):
        drifted = [e for e in events(kube, own_namespace, name) if e["reason"] == "Drifted"]
        assert drifted and "tags" in drifted[-1]["message"], (kind, drifted)

    # Gone from the cloud: absent from the batch's answer, found missing, made again.
    gone_arn = ready[("Topic", "topic2")]["status"]["arn"]
    aws.sns.delete_topic(TopicArn=gone_arn)

    def remade() -> bool:
        try:
            tags = aws.sns.list_tags_for_resource(ResourceArn=gone_arn)["Tags"]
        except botocore.exceptions.ClientError:
            return False
        uid = ready[("Topic", "topic2")]["metadata"]["uid"]
        return {"Key": "provisioner.dev/owner-uid", "Value": uid} in tags

    wait_for(remade, timeout=60, what="the deleted topic made again")
