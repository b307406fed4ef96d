"""RdsClient against moto's server."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from provisioner.aws import errors
from provisioner.aws.session import CALLS
from provisioner.kinds.rds import RdsClient
from provisioner.kinds.registry import KINDS, make_clients
from tests.cloud.conftest import full_client

pytestmark = pytest.mark.cloud

SPEC = {
    "engine": "postgres",
    "engineVersion": "15.4",
    "instanceClass": "db.t3.micro",
    "databaseName": "appdb",
}
SECRETS = {"password": "not-a-real-password-123"}
CONNECTION_KEYS = {"host", "port", "username", "database", "engine", "arn"}


@pytest.fixture
def rds(aws):
    return RdsClient(aws)


def _raw_tags(aws, arn):
    listing = aws.client("rds").list_tags_for_resource(ResourceName=arn)["TagList"]
    return {tag["Key"]: tag["Value"] for tag in listing}


def _final_snapshots(aws, identifier):
    snapshots = aws.client("rds").describe_db_snapshots(SnapshotType="manual")["DBSnapshots"]
    pattern = re.compile(rf"{re.escape(identifier)}-final-\d+")
    return [
        s["DBSnapshotIdentifier"] for s in snapshots if pattern.fullmatch(s["DBSnapshotIdentifier"])
    ]


def test_make_clients_keys_every_kind(aws):
    clients = make_clients(aws)
    assert set(clients) == {k.kind for k in KINDS}
    assert set(clients) == {k.kind for k in KINDS}


def test_lifecycle(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC, tags={"team": "a"}, deletion_policy="Delete")
    assert rds.observe(res).exists is False

    rds.create(res, SECRETS)
    obs = rds.observe(res)
    assert obs.exists and obs.owned_by(res)
    assert obs.available and not obs.deleting and obs.state == "available"
    assert obs.diffs == []
    assert _raw_tags(aws, obs.arn) == res.desired_tags
    assert set(obs.connection) == CONNECTION_KEYS
    conn = obs.connection
    assert conn["username"] == "app" and conn["database"] == "appdb"
    assert conn["engine"] == "postgres" and conn["port"] == "5432" and conn["host"]
    assert conn["arn"] == obs.arn and obs.arn.startswith("arn:aws:rds:")
    assert obs.status == {
        "endpoint": f"{conn['host']}:5432",
        "pendingChanges": "",
        "masterUserSecret": None,  # the operator keeps the password: none to show
        "storageEncrypted": True,  # encrypted unless the spec says otherwise
        "kmsKeyId": obs.status["kmsKeyId"],  # RDS's default key (moto names it so)
        "subnetGroup": None,  # none made: the spec names no subnets
    }

    before = CALLS.total()
    rds.update(res, obs, obs.diffs)  # up to date: no call at all
    assert CALLS.total() == before

    changed = replace(
        res,
        spec=replace(
            res.spec,
            instance_class="db.t3.small",
            allocated_storage_gib=30,
            engine_version="16.3",
            allow_major_version_upgrade=True,  # 15 -> 16
            multi_az=True,
            publicly_accessible=True,
            backup_retention_days=3,
        ),
        user_tags={"team": "b", "env": "test"},
    )
    obs = rds.observe(changed)
    assert {d.field for d in obs.diffs} == {
        "spec.instanceClass",
        "spec.storage.sizeGiB",
        "spec.engineVersion",
        "spec.multiAZ",
        "spec.publiclyAccessible",
        "spec.backupRetentionDays",
        "tags",
    }
    rds.update(changed, obs, obs.diffs)
    assert rds.observe(changed).diffs == []
    assert _raw_tags(aws, obs.arn) == changed.desired_tags

    rds.set_password(changed, "another-password-456")

    rds.delete(changed, obs)
    assert rds.observe(changed).exists is False
    rds.delete(changed, obs)  # already gone: success
    assert _final_snapshots(aws, res.external_name) == []


def test_removed_user_tag_is_removed(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC, tags={"team": "a", "old": "x"})
    rds.create(res, SECRETS)
    changed = replace(res, user_tags={"team": "a"})
    obs = rds.observe(changed)
    assert [d.field for d in obs.diffs] == ["tags"]
    rds.update(changed, obs, obs.diffs)
    assert _raw_tags(aws, obs.arn) == changed.desired_tags


def test_port_change_is_a_diff(rds, make_resource):
    # moto ignores ModifyDBInstance(DBPortNumber=...), so only the diff is checked here.
    res = make_resource("DatabaseInstance", SPEC)
    rds.create(res, SECRETS)
    obs = rds.observe(replace(res, spec=replace(res.spec, port=5433)))
    assert [(d.field, d.observed, d.desired) for d in obs.diffs] == [("spec.port", 5432, 5433)]


def test_major_version_only_matches_any_minor(rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC)
    rds.create(res, SECRETS)
    assert rds.observe(replace(res, spec=replace(res.spec, engine_version="15"))).diffs == []


def test_snapshot_policy_takes_final_snapshot(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC, deletion_policy="Snapshot")
    rds.create(res, SECRETS)
    rds.delete(res, rds.observe(res))
    assert rds.observe(res).exists is False
    assert len(_final_snapshots(aws, res.external_name)) == 1


def test_foreign_instance_is_observed_not_owned(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC)
    aws.client("rds").create_db_instance(
        DBInstanceIdentifier=res.external_name,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="other",
        MasterUserPassword="other-password-1",
    )
    obs = rds.observe(res)
    assert obs.exists and obs.owner_uid == "" and not obs.owned_by(res)
    with pytest.raises(errors.ConflictError):
        rds.create(res, SECRETS)


def test_not_available_refuses_modify(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC)
    rds.create(res, SECRETS)
    full_client(aws.client("rds")).stop_db_instance(DBInstanceIdentifier=res.external_name)
    changed = replace(res, spec=replace(res.spec, instance_class="db.t3.small"))
    obs = rds.observe(changed)
    assert obs.exists and not obs.available and obs.state == "stopped"
    with pytest.raises(errors.RetryableError, match="instance is stopped"):
        rds.update(changed, obs, obs.diffs)


def test_storage_never_shrinks(rds, make_resource):
    res = make_resource("DatabaseInstance", {**SPEC, "allocatedStorageGiB": 30})
    rds.create(res, SECRETS)
    smaller = replace(res, spec=replace(res.spec, allocated_storage_gib=20))
    with pytest.raises(errors.TerminalError, match="cannot shrink"):
        obs = rds.observe(smaller)
        rds.update(smaller, obs, obs.diffs)


def test_storage_type_and_iops_are_created_and_changed_together(rds, make_resource):
    res = make_resource(
        "DatabaseInstance", {**SPEC, "storage": {"sizeGiB": 100, "type": "gp3", "iops": 3000}}
    )
    created = rds.create(res, SECRETS)
    instance = created.client_state["instance"]
    assert (instance["StorageType"], instance.get("Iops")) == ("gp3", 3000)
    assert rds.observe(res).diffs == []
    faster = replace(res, spec=replace(res.spec, storage_type="io1", iops=5000))
    obs = rds.observe(faster)
    assert {d.field for d in obs.diffs} == {"spec.storage.type", "spec.storage.iops"}
    rds.update(faster, obs, obs.diffs)
    assert rds.observe(faster).diffs == []
    # Unset type and IOPS leave the cloud's choice alone.
    left = replace(res, spec=replace(res.spec, storage_type=None, iops=None))
    assert rds.observe(left).diffs == []


def test_unknown_engine_is_terminal(rds, make_resource):
    res = make_resource("DatabaseInstance", {**SPEC, "engine": "nosuchdb"})
    with pytest.raises(errors.TerminalError) as caught:
        rds.create(res, SECRETS)
    assert caught.value.code == "InvalidParameterValue"


@pytest.mark.skip(reason="moto 5.2.5 accepts any engineVersion and any DBInstanceClass")
@pytest.mark.parametrize("field", [{"engineVersion": "99.99"}, {"instanceClass": "db.bogus.huge"}])
def test_invalid_version_or_class_is_terminal(rds, make_resource, field):
    with pytest.raises(errors.TerminalError):
        rds.create(make_resource("DatabaseInstance", {**SPEC, **field}), SECRETS)


def test_describe_many_answers_for_those_that_exist_one_call_per_hundred(aws, rds, make_resource):
    mine = [make_resource("DatabaseInstance", SPEC, name=f"db{i}") for i in range(3)]
    for res in mine:
        rds.create(res, SECRETS)
    missing = [f"absent-{i:03d}" for i in range(117)]
    names = [mine[0].external_name, *missing[:60], mine[1].external_name, *missing[60:]]
    names.append(mine[2].external_name)  # 121 names: two batches

    before = CALLS.counts[("rds", "DescribeDBInstances", "ok")]
    found = rds.describe_many("us-east-1", names)
    assert CALLS.counts[("rds", "DescribeDBInstances", "ok")] - before == 2
    assert set(found) == {res.external_name for res in mine}
    for res in mine:
        # What a batch says stands for what observe says, diffs and tags included.
        changed = replace(res, spec=replace(res.spec, backup_retention_days=21))
        batched = replace(rds.observed(changed, found[res.external_name]), client_state={})
        assert batched == replace(rds.observe(changed), client_state={})
        assert [d.field for d in rds.observed(changed, found[res.external_name]).diffs] == [
            "spec.backupRetentionDays"
        ]
    assert rds.describe_many("us-east-1", []) == {}
