"""RdsClient with spec.masterPassword against moto's server: Secrets Manager keeps the
password, the switch either way, the rotation RDS makes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from provisioner.kinds import rds_password
from provisioner.kinds.contract import CloudKeptPasswordClient, PasswordClient
from provisioner.kinds.rds import RdsClient
from tests.cloud.test_awslike import client as awslike_client
from tests.cloud.test_awslike import db_states, error_of, proxy  # noqa: F401 - its fixture
from tests.cloud.test_awslike import name as awslike_name

pytestmark = pytest.mark.cloud

SPEC = {"engine": "postgres", "instanceClass": "db.t3.micro", "databaseName": "appdb"}
MANAGED = {**SPEC, "masterPassword": {"managedBy": "SecretsManager"}}
SECRETS = {"password": "Operator0Generated0Password00000"}


@pytest.fixture
def rds(aws):
    return RdsClient(aws)


def _instance(aws, identifier):
    return aws.client("rds").describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][
        0
    ]


def test_the_client_offers_both_password_capabilities(rds):
    assert isinstance(rds, PasswordClient) and isinstance(rds, CloudKeptPasswordClient)


def test_secrets_manager_keeps_the_password_from_the_create(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", MANAGED, deletion_policy="Delete")
    rds.create(res, SECRETS)
    obs = rds.observe(res)
    secret = _instance(aws, res.external_name)["MasterUserSecret"]
    assert obs.connection[rds_password.SECRET_ARN] == secret["SecretArn"]
    assert "password" not in obs.connection
    assert obs.status[rds_password.STATUS]["arn"] == secret["SecretArn"]
    assert obs.diffs == []
    assert rds.cloud_keeps(res, obs) and not rds.handing_to_cloud(res, obs)
    # The operator's password went nowhere: the secret holds RDS's own.
    value = aws.client("secretsmanager").get_secret_value(SecretId=secret["SecretArn"])
    assert json.loads(value["SecretString"])["password"] != SECRETS["password"]
    assert rds_password.access_arns(res, obs) == [secret["SecretArn"]]


def test_a_named_key_encrypts_the_secret_and_is_granted(aws, rds, make_resource):
    key = aws.client("kms").create_key(Description="db secret")["KeyMetadata"]
    spec = {**SPEC, "masterPassword": {"managedBy": "SecretsManager", "kmsKeyId": key["KeyId"]}}
    res = make_resource("DatabaseInstance", spec, deletion_policy="Delete")
    rds.create(res, SECRETS)
    obs = rds.observe(res)
    shown = obs.status[rds_password.STATUS]
    assert shown["kmsKeyId"] == key["Arn"]
    assert rds_password.access_arns(res, obs) == [shown["arn"], key["Arn"]]


def test_switching_both_ways(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", SPEC, deletion_policy="Delete")
    rds.create(res, SECRETS)
    obs = rds.observe(res)
    assert rds_password.STATUS not in obs.status or obs.status[rds_password.STATUS] is None
    assert not rds.cloud_keeps(res, obs) and rds.handed_back(res) is None

    managed = replace(
        res,
        spec=replace(
            res.spec, master_password=rds_password.PasswordSpec(managed_by="SecretsManager")
        ),
    )
    obs = rds.observe(managed)
    assert [d.field for d in obs.diffs] == [rds_password.FIELD]
    assert rds.handing_to_cloud(managed, obs)
    rds.update(managed, obs, obs.diffs)
    assert rds.handed_back(managed) is None  # RDS made the password
    obs = rds.observe(managed)
    assert obs.diffs == [] and obs.connection[rds_password.SECRET_ARN]
    first_secret = obs.connection[rds_password.SECRET_ARN]

    back = rds.observe(res)
    assert [(d.observed, d.desired) for d in back.diffs] == [("SecretsManager", "Operator")]
    rds.update(res, back, back.diffs)
    password = rds.handed_back(res)
    assert password is not None and len(password) == 32 and password.isalnum()
    assert rds.handed_back(res) is None  # taken once
    obs = rds.observe(res)
    assert obs.diffs == [] and rds_password.SECRET_ARN not in obs.connection
    assert "MasterUserSecret" not in _instance(aws, res.external_name)
    # RDS deletes the secret it kept.
    listed = aws.client("secretsmanager").list_secrets()["SecretList"]
    assert first_secret not in {s["ARN"] for s in listed}


def test_a_rotation_is_asked_of_rds(aws, rds, make_resource):
    res = make_resource("DatabaseInstance", MANAGED, deletion_policy="Delete")
    rds.create(res, SECRETS)
    arn = rds.observe(res).connection[rds_password.SECRET_ARN]
    sm = aws.client("secretsmanager")
    before = sm.list_secret_version_ids(SecretId=arn)["Versions"]
    rds.rotate_kept(res)
    after = sm.list_secret_version_ids(SecretId=arn)["Versions"]
    assert len(after) == len(before) + 1


# -- the aws-like profile plays what RDS shows meanwhile ---------------------------------------


def test_awslike_plays_the_switch_and_the_rotation(proxy):  # noqa: F811
    rds, ident = awslike_client("rds", proxy.url), awslike_name("db")
    rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        ManageMasterUserPassword=True,
    )
    seen = db_states(rds, ident, "available")
    assert seen[-1][1]["MasterUserSecret"]["SecretArn"]

    # A rotation resets the credentials; the instance takes no other change meanwhile.
    answer = rds.modify_db_instance(
        DBInstanceIdentifier=ident, RotateMasterUserPassword=True, ApplyImmediately=True
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "resetting-master-credentials"
    code, _ = error_of(
        rds.modify_db_instance,
        DBInstanceIdentifier=ident,
        RotateMasterUserPassword=True,
        ApplyImmediately=True,
    )
    assert code == "InvalidDBInstanceState"
    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["resetting-master-credentials", "available"]

    # Giving the password back to the operator modifies the instance.
    answer = rds.modify_db_instance(
        DBInstanceIdentifier=ident,
        ManageMasterUserPassword=False,
        MasterUserPassword="Operator0Generated0Password00000",
        ApplyImmediately=True,
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "modifying"
    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["modifying", "available"]
    assert "MasterUserSecret" not in seen[-1][1]

    # And taking it again.
    answer = rds.modify_db_instance(
        DBInstanceIdentifier=ident, ManageMasterUserPassword=True, ApplyImmediately=True
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "modifying"
    seen = db_states(rds, ident, "available")
    assert seen[-1][1]["MasterUserSecret"]["SecretArn"]
    rds.delete_db_instance(DBInstanceIdentifier=ident, SkipFinalSnapshot=True)
