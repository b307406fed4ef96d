"""DatabaseInstance's network, encryption, deletion protection, windows and versions, at the
RDS client against moto in process: what is created, what is refused before any create, what
is compared, and what is deleted after the instance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from provisioner.aws import errors
from provisioner.aws.session import Aws, AwsSettings
from provisioner.kinds import rds_network, rds_settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff
from provisioner.kinds.rds import RdsClient, list_instances

REGION = "us-east-1"
BASE = {"engine": "postgres", "instanceClass": "db.t3.micro", "deletionPolicy": "Delete"}


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        subnets = [
            ec2.create_subnet(
                VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=f"{REGION}{z}"
            )["Subnet"]["SubnetId"]
            for i, z in enumerate("ab")
        ]
        groups = [
            ec2.create_security_group(GroupName=f"db-{i}", Description="db", VpcId=vpc)["GroupId"]
            for i in range(2)
        ]
        aws = Aws(AwsSettings(region=REGION, max_wait=0.0), kinds.ERROR_CODES)
        yield {
            "aws": aws,
            "client": RdsClient(aws),
            "rds": boto3.client("rds", region_name=REGION),
            "subnets": subnets,
            "groups": groups,
        }


def resource(spec: dict[str, Any], uid: str = "uid-orders", status: dict | None = None) -> Any:
    body = {
        "kind": "DatabaseInstance",
        "metadata": {"namespace": "team-a", "name": "orders", "uid": uid, "generation": 1},
        "spec": {**BASE, **spec},
        "status": status or {},
    }
    return kinds.parse(body, region=REGION, cluster_id="test")


def tags_of(rds: Any, arn: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in rds.list_tags_for_resource(ResourceName=arn)["TagList"]}


def test_subnet_ids_make_a_tagged_subnet_group_and_it_goes_after_the_instance(cloud):
    r = resource(
        {"network": {"subnetIds": cloud["subnets"], "securityGroupIds": cloud["groups"][:1]}}
    )
    absent = cloud["client"].observe(r)
    assert not absent.exists
    assert absent.status == {"subnetGroup": f"provisioner-{r.external_name}"}

    obs = cloud["client"].create(r, {"password": "p" * 24})
    group = cloud["rds"].describe_db_subnet_groups(
        DBSubnetGroupName=f"provisioner-{r.external_name}"
    )
    (made,) = group["DBSubnetGroups"]
    assert {s["SubnetIdentifier"] for s in made["Subnets"]} == set(cloud["subnets"])
    assert tags_of(cloud["rds"], made["DBSubnetGroupArn"])["provisioner.dev/owner-uid"] == r.uid
    instance = cloud["rds"].describe_db_instances(DBInstanceIdentifier=r.external_name)
    (db,) = instance["DBInstances"]
    assert db["DBSubnetGroup"]["DBSubnetGroupName"] == made["DBSubnetGroupName"]
    assert [g["VpcSecurityGroupId"] for g in db["VpcSecurityGroups"]] == cloud["groups"][:1]
    assert db["StorageEncrypted"] is True and db["DeletionProtection"] is False
    assert obs is not None and obs.status["subnetGroup"] == made["DBSubnetGroupName"]
    assert obs.status["storageEncrypted"] is True

    # A second attempt after a crash finds its own group and makes no second one.
    cloud["rds"].delete_db_instance(DBInstanceIdentifier=r.external_name, SkipFinalSnapshot=True)
    cloud["client"].create(r, {"password": "p" * 24})
    listed = [o.name for o in list_instances(cloud["aws"], REGION)]
    assert listed.count(made["DBSubnetGroupName"]) == 1

    cloud["rds"].delete_db_instance(DBInstanceIdentifier=r.external_name, SkipFinalSnapshot=True)
    gone = cloud["client"].observe(r)
    assert not gone.exists
    cloud["client"].remove_leftovers(r, gone)
    assert cloud["rds"].describe_db_subnet_groups()["DBSubnetGroups"] == [
        g
        for g in cloud["rds"].describe_db_subnet_groups()["DBSubnetGroups"]
        if g["DBSubnetGroupName"] != made["DBSubnetGroupName"]
    ]
    assert made["DBSubnetGroupName"] not in [o.name for o in list_instances(cloud["aws"], REGION)]


@pytest.mark.parametrize(
    ("network", "named"),
    [
        ({"subnetIds": ["subnet-0000000a", "SUBNET"]}, "spec.network.subnetIds: subnet"),
        ({"securityGroupIds": ["sg-0000000b"]}, "spec.network.securityGroupIds: security group"),
        ({"subnetGroupName": "nowhere"}, "spec.network.subnetGroupName: DB subnet group nowhere"),
    ],
)
def test_what_does_not_exist_is_named_before_anything_is_made(cloud, network, named):
    network = {
        k: [cloud["subnets"][0] if s == "SUBNET" else s for s in v] if k == "subnetIds" else v
        for k, v in network.items()
    }
    r = resource({"network": network})
    with pytest.raises(errors.TerminalError) as refused:
        cloud["client"].create(r, {"password": "p" * 24})
    assert named in refused.value.message and "nothing was created" in refused.value.message
    assert cloud["subnets"][0] not in refused.value.message
    assert cloud["rds"].describe_db_instances()["DBInstances"] == []
    assert not [
        g
        for g in cloud["rds"].describe_db_subnet_groups()["DBSubnetGroups"]
        if g["DBSubnetGroupName"].startswith("provisioner-")
    ]


def test_a_subnet_group_of_another_owner_is_never_used_nor_deleted(cloud):
    r = resource({"network": {"subnetIds": cloud["subnets"]}})
    other = resource({"network": {"subnetIds": cloud["subnets"]}}, uid="uid-other")
    name = f"provisioner-{r.external_name}"
    cloud["rds"].create_db_subnet_group(
        DBSubnetGroupName=name,
        DBSubnetGroupDescription="someone else's",
        SubnetIds=cloud["subnets"],
        Tags=[{"Key": k, "Value": v} for k, v in other.desired_tags.items()],
    )
    with pytest.raises(errors.TerminalError, match="not made for this resource"):
        cloud["client"].create(r, {"password": "p" * 24})
    cloud["client"].remove_leftovers(r, cloud["client"].observe(r))
    assert cloud["rds"].describe_db_subnet_groups(DBSubnetGroupName=name)["DBSubnetGroups"]


def test_an_existing_subnet_group_is_used_and_left_alone(cloud):
    cloud["rds"].create_db_subnet_group(
        DBSubnetGroupName="shared", DBSubnetGroupDescription="d", SubnetIds=cloud["subnets"]
    )
    r = resource({"network": {"subnetGroupName": "shared"}})
    obs = cloud["client"].create(r, {"password": "p" * 24})
    assert obs is not None and obs.status["subnetGroup"] is None
    cloud["rds"].delete_db_instance(DBInstanceIdentifier=r.external_name, SkipFinalSnapshot=True)
    cloud["client"].remove_leftovers(r, cloud["client"].observe(r))
    assert cloud["rds"].describe_db_subnet_groups(DBSubnetGroupName="shared")["DBSubnetGroups"]


def test_security_groups_windows_and_protection_are_compared_and_written(cloud):
    first, second = cloud["groups"]
    spec = {
        "network": {"securityGroupIds": [first]},
        "maintenanceWindow": "Sun:03:00-Sun:04:00",
        "backupWindow": "01:00-01:30",
        "autoMinorVersionUpgrade": False,
        "encryption": {"enabled": False},
    }
    r = resource(spec)
    cloud["client"].create(r, {"password": "p" * 24})
    obs = cloud["client"].observe(r)
    assert obs.diffs == []  # RDS answers the window in lower case: the same window
    assert obs.status["storageEncrypted"] is False and obs.status["kmsKeyId"] is None

    changed = resource(
        {
            **spec,
            "network": {"securityGroupIds": [second, first]},
            "deletionProtection": True,
            "backupWindow": "05:00-05:30",
        }
    )
    obs = cloud["client"].observe(changed)
    assert {d.field for d in obs.diffs} == {
        "spec.network.securityGroupIds",
        "spec.deletionProtection",
        "spec.backupWindow",
    }
    cloud["client"].update(changed, obs, obs.diffs)
    assert cloud["client"].observe(changed).diffs == []

    missing = resource({**spec, "network": {"securityGroupIds": ["sg-00000000"]}})
    obs = cloud["client"].observe(missing)
    with pytest.raises(errors.TerminalError, match="security group sg-00000000 not found"):
        cloud["client"].update(missing, obs, obs.diffs)

    # Protected in the cloud, the spec no longer asks for it: delete turns it off first.
    cloud["client"].delete(r, cloud["client"].observe(r))
    assert not cloud["client"].observe(r).exists


def test_a_kms_key_is_named_at_create(cloud):
    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
    r = resource({"encryption": {"kmsKeyId": key}})
    obs = cloud["client"].create(r, {"password": "p" * 24})
    assert obs is not None and obs.status == {**obs.status, "storageEncrypted": True}
    (db,) = cloud["rds"].describe_db_instances(DBInstanceIdentifier=r.external_name)["DBInstances"]
    assert db["StorageEncrypted"] is True and db["KmsKeyId"] == key


@pytest.mark.parametrize(
    ("observed", "desired", "allow", "outcome"),
    [
        ("16.3", "16.4", False, {}),
        ("16.3", "16", False, {}),
        ("16.3", "17.1", True, {"AllowMajorVersionUpgrade": True}),
        ("16.3", "17.1", False, "major version upgrade from 16.3"),
        ("16.4", "16.3", True, "older than the instance's 16.4"),
        ("16.4", "15", True, "older than the instance's 16.4"),
        ("8.0.35", "8.4.3", False, "set spec.allowMajorVersionUpgrade: true"),
    ],
)
def test_engine_versions_minor_in_place_major_when_allowed_never_down(
    observed, desired, allow, outcome
):
    engine = "mysql" if observed.startswith("8.") else "postgres"
    diff = FieldDiff("spec.engineVersion", observed, desired)
    if isinstance(outcome, dict):
        assert rds_settings.version_params(engine, allow, diff) == outcome
    else:
        with pytest.raises(errors.TerminalError, match=outcome):
            rds_settings.version_params(engine, allow, diff)
    assert rds_settings.version_params(engine, allow, None) == {}


def test_the_recorded_subnet_group_stays_until_the_resource_is_gone():
    recorded = resource({}, status={"subnetGroup": "provisioner-x"})
    assert rds_network.recorded(recorded, None) == "provisioner-x"
    plain = resource({})
    assert rds_network.recorded(plain, None) is None
    adopted = {"DBSubnetGroup": {"DBSubnetGroupName": f"provisioner-{plain.external_name}"}}
    assert rds_network.recorded(plain, adopted) == f"provisioner-{plain.external_name}"
    assert rds_network.recorded(plain, {"DBSubnetGroup": {"DBSubnetGroupName": "x"}}) is None
