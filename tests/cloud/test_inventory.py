"""The one cloud listing (`provisioner leaks`, the tests and bench/ share it), against moto."""

from __future__ import annotations

import uuid

import pytest

from provisioner.kinds.registry import KINDS
from provisioner.model.resource import CLUSTER_TAG, OWNER_UID_TAG
from provisioner.tools.leaks import cloud_resources

pytestmark = pytest.mark.cloud


def test_lists_every_kind_with_its_tags_and_filters_by_cluster(aws):
    cluster, uid = f"c-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    ours = {CLUSTER_TAG: cluster, OWNER_UID_TAG: uid}
    suffix = uuid.uuid4().hex[:8]
    s3, sqs = aws.client("s3"), aws.client("sqs")
    s3.create_bucket(Bucket=f"untagged-{suffix}")
    s3.create_bucket(Bucket=f"ours-{suffix}")
    s3.put_bucket_tagging(
        Bucket=f"ours-{suffix}",
        Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in ours.items()]},
    )
    sqs.create_queue(QueueName=f"ours-{suffix}", tags=ours)
    aws.client("sns").create_topic(
        Name=f"other-{suffix}", Tags=[{"Key": CLUSTER_TAG, "Value": "someone-else"}]
    )
    aws.client("rds").create_db_instance(
        DBInstanceIdentifier=f"other-{suffix}",
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="not-a-secret-1",
        Tags=[{"Key": CLUSTER_TAG, "Value": "someone-else"}],
    )

    everything = {(r.kind, r.name): r.tags for r in cloud_resources(aws)}
    assert everything[("S3Bucket", f"untagged-{suffix}")] == {}
    assert everything[("S3Bucket", f"ours-{suffix}")] == ours
    assert everything[("Queue", f"ours-{suffix}")] == ours
    assert everything[("DatabaseInstance", f"other-{suffix}")][CLUSTER_TAG] == "someone-else"
    # Every kind, and what the operator makes beside a database (its parameter group).
    listed = {kind for kind, _ in everything}
    assert listed - {"DBParameterGroup", "DBSubnetGroup"} == {k.kind for k in KINDS}

    mine = cloud_resources(aws, cluster)
    assert sorted((r.kind, r.name, r.owner_uid) for r in mine) == [
        ("Queue", f"ours-{suffix}", uid),
        ("S3Bucket", f"ours-{suffix}", uid),
    ]
    assert [r.kind for r in cloud_resources(aws, cluster, kinds=["Queue"])] == ["Queue"]
