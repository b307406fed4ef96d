"""provisioner.model.resource: parsing bodies, defaults, tags and external names."""

from __future__ import annotations

import pytest

from provisioner.kinds import registry as kinds
from provisioner.kinds.rds_instance import DatabaseSpec
from provisioner.kinds.s3 import BucketSpec
from provisioner.kinds.sqs import QueueSpec
from provisioner.model import naming
from provisioner.model.resource import (
    CLUSTER_TAG,
    NAME_TAG,
    NAMESPACE_TAG,
    OWNER_UID_TAG,
    OWNERSHIP_TAG_KEYS,
)

UID = "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"
MINIMAL_SPECS = {
    "DatabaseInstance": {"engine": "postgres", "instanceClass": "db.t3.micro"},
    "S3Bucket": {},
    "Queue": {},
}


def body(kind, spec=None, **meta):
    metadata = {"namespace": "team-a", "name": "orders", "uid": UID, **meta}
    result = {"kind": kind, "metadata": metadata}
    if spec is not None:
        result["spec"] = spec
    return result


def parse(b, region="us-west-2", cluster_id="prod"):
    return kinds.parse(b, region=region, cluster_id=cluster_id)


@pytest.mark.parametrize(
    ("kind", "spec_type", "policy"),
    [
        ("DatabaseInstance", DatabaseSpec, "Snapshot"),
        ("S3Bucket", BucketSpec, "Delete"),
        ("Queue", QueueSpec, "Delete"),
    ],
)
def test_from_body_minimal_defaults(kind, spec_type, policy):
    r = parse(body(kind, MINIMAL_SPECS[kind]))
    assert r.kind == kind
    assert r.namespace == "team-a"
    assert r.name == "orders"
    assert r.uid == UID
    assert r.generation == 1
    assert r.region == "us-west-2"
    assert r.cluster_id == "prod"
    assert isinstance(r.spec, spec_type)
    assert r.deletion_policy == policy
    assert r.secret_name == "orders-connection"
    assert r.user_tags == {}
    assert r.annotations == {}
    assert r.status == {}
    assert r.ref == "team-a/orders"


@pytest.mark.parametrize("kind", ["S3Bucket", "Queue"])
def test_from_body_without_spec_key(kind):
    r = parse(body(kind))
    assert r.deletion_policy == "Delete"
    assert r.secret_name == "orders-connection"


def test_from_body_explicit_values_win():
    spec = {
        **MINIMAL_SPECS["DatabaseInstance"],
        "region": "eu-central-1",
        "deletionPolicy": "Retain",
        "writeConnectionSecretToRef": {"name": "db-creds"},
        "tags": {"team": "a"},
    }
    r = parse(
        body(
            "DatabaseInstance",
            spec,
            generation=7,
            annotations={"a": "b"},
        )
        | {"status": {"observedGeneration": 6}}
    )
    assert r.region == "eu-central-1"
    assert r.deletion_policy == "Retain"
    assert r.secret_name == "db-creds"
    assert r.generation == 7
    assert r.user_tags == {"team": "a"}
    assert r.annotations == {"a": "b"}
    assert r.status == {"observedGeneration": 6}


def test_from_body_status_is_a_copy():
    b = body("Queue", {}) | {"status": {"arn": "x"}}
    r = parse(b)
    r.status["externalName"] = "y"
    assert b["status"] == {"arn": "x"}


def test_database_spec_defaults():
    spec = parse(body("DatabaseInstance", MINIMAL_SPECS["DatabaseInstance"])).spec
    assert spec == DatabaseSpec(engine="postgres", instance_class="db.t3.micro")
    assert spec.allocated_storage_gib == 20
    assert spec.master_username == "app"
    assert spec.port is None
    assert spec.backup_retention_days == 7
    assert spec.multi_az is False
    assert spec.publicly_accessible is False


def test_database_spec_parses_values():
    spec = DatabaseSpec.parse(
        {
            "engine": "mysql",
            "instanceClass": "db.m5.large",
            "storage": {"sizeGiB": "50", "type": "gp3", "iops": 3000},
            "engineVersion": "",
            "databaseName": "main",
            "port": 3307,
            "multiAZ": True,
            "backupRetentionDays": 0,
        }
    )
    assert spec.allocated_storage_gib == 50
    assert (spec.storage_type, spec.iops) == ("gp3", 3000)
    assert spec.engine_version is None
    assert spec.database_name == "main"
    assert spec.port == 3307
    assert spec.multi_az is True
    assert spec.backup_retention_days == 0


def test_bucket_and_queue_spec_parsing():
    bucket = BucketSpec.parse({"lifecycle": {"expireAfterDays": 30}, "versioning": True})
    assert bucket.expire_after_days == 30
    assert bucket.versioning is True
    assert bucket.block_public_access is True
    assert bucket.encryption == "AES256"
    assert BucketSpec.parse({}).expire_after_days is None
    queue = QueueSpec.parse({"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 3}})
    assert queue.dead_letter_queue_ref == "dlq"
    assert queue.max_receive_count == 3
    assert QueueSpec.parse({}).dead_letter_queue_ref is None
    assert QueueSpec.parse({}).max_receive_count == 5


# -- tags -------------------------------------------------------------------------


def test_desired_tags_ownership_tags_cannot_be_overridden():
    hostile = dict.fromkeys(OWNERSHIP_TAG_KEYS, "evil")
    r = parse(body("S3Bucket", {"tags": {**hostile, "team": "a", "env": "prod"}}))
    tags = r.desired_tags
    assert tags[OWNER_UID_TAG] == UID
    assert tags[NAMESPACE_TAG] == "team-a"
    assert tags[NAME_TAG] == "orders"
    assert tags[CLUSTER_TAG] == "prod"
    assert tags["team"] == "a"
    assert tags["env"] == "prod"
    assert len(tags) == 6
    assert "evil" not in tags.values()


def test_ownership_tags_are_the_four_keys():
    r = parse(body("Queue", {}))
    assert set(r.ownership_tags) == set(OWNERSHIP_TAG_KEYS)
    assert len(OWNERSHIP_TAG_KEYS) == 4
    assert r.desired_tags == r.ownership_tags


def test_desired_tags_does_not_mutate_user_tags():
    r = parse(body("Queue", {"tags": {OWNER_UID_TAG: "evil", "k": "v"}}))
    _ = r.desired_tags
    assert r.user_tags == {OWNER_UID_TAG: "evil", "k": "v"}


# -- external names ----------------------------------------------------------------


def test_external_name_bucket_given_and_derived():
    assert parse(body("S3Bucket", {"bucketName": "my-bucket"})).external_name == "my-bucket"
    derived = parse(body("S3Bucket", {})).external_name
    assert derived == naming.bucket_name("team-a", "orders", UID)
    assert derived.endswith(naming.uid_hash(UID))
    # an empty bucketName is treated as absent
    assert parse(body("S3Bucket", {"bucketName": ""})).external_name == derived


def test_external_name_queue_given_and_derived():
    assert parse(body("Queue", {"queueName": "MyQueue_1"})).external_name == "MyQueue_1"
    given_fifo = parse(body("Queue", {"queueName": "jobs.fifo", "fifo": True}))
    assert given_fifo.external_name == "jobs.fifo"
    derived = parse(body("Queue", {})).external_name
    assert derived == naming.queue_name("team-a", "orders", UID, fifo=False)
    assert not derived.endswith(".fifo")


def test_external_name_fifo_queue_derived_ends_with_fifo():
    r = parse(body("Queue", {"fifo": True}))
    assert r.external_name.endswith(".fifo")
    assert r.external_name == naming.queue_name("team-a", "orders", UID, fifo=True)
    assert len(r.external_name) <= 80


def test_external_name_database_is_derived():
    r = parse(body("DatabaseInstance", MINIMAL_SPECS["DatabaseInstance"]))
    assert r.external_name == naming.db_instance_identifier("team-a", "orders", UID)


def test_external_name_depends_on_uid():
    a = parse(body("S3Bucket", {}))
    b = parse(
        {**body("S3Bucket", {}), "metadata": {"namespace": "team-a", "name": "orders", "uid": "u2"}}
    )
    assert a.external_name != b.external_name


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown kind 'Widget'"):
        parse(body("Widget", {}))


# spec.ttl and spec.expiresAt ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("72h", 259200), ("1h30m", 5400), ("7d", 604800), ("1d2h3m4s", 93784)],
)
def test_durations(text, seconds):
    from provisioner.model.resource import parse_duration

    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "3 days", "1.5h", "h", "10"])
def test_durations_refused(text):
    from provisioner.model.resource import parse_duration

    with pytest.raises(ValueError):
        parse_duration(text)


def test_expiry_counts_from_the_api_servers_creation_time():
    from datetime import UTC, datetime

    from provisioner.model.resource import expiry, parse_time

    created = parse_time("2026-12-01T10:00:00Z")
    assert expiry({"ttl": "90m"}, created) == datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
    at = {"expiresAt": "2026-12-24T18:00:00Z"}
    assert expiry(at, created) == datetime(2026, 12, 24, 18, tzinfo=UTC)
    assert expiry({}, created) is None
