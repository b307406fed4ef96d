"""DB parameter groups and reboots in the aws-like cloud, straight through the proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from provisioner_dev.awslike import AwsLikeProxy
from tests.cloud.test_awslike import SCALE, _proxy, client, create_db, db_states, error_of, name

pytestmark = pytest.mark.cloud

REBOOT_SECONDS = 1.5


@pytest.fixture(scope="module")
def proxy(moto_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsLikeProxy]:
    yield from _proxy(
        moto_url,
        tmp_path_factory.mktemp("awslike-parameters") / "proxy.log",
        f"--duration=rds.reboot={REBOOT_SECONDS * SCALE:g}",
    )


def parameters(rds, group: str, source: str | None = None) -> dict[str, tuple[str, str, str]]:
    """name -> (value, Source, ApplyType)."""
    chosen = {"Source": source} if source else {}
    found = rds.describe_db_parameters(DBParameterGroupName=group, **chosen)["Parameters"]
    return {p["ParameterName"]: (p["ParameterValue"], p["Source"], p["ApplyType"]) for p in found}


def apply_status(rds, ident: str) -> str:
    found = rds.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
    return found["DBParameterGroups"][0]["ParameterApplyStatus"]


def test_the_family_is_listed_with_apply_types_and_unknown_or_immediate_static_refused(proxy):
    rds, group = client("rds", proxy.url), name("pg")
    default = rds.describe_db_engine_versions(Engine="postgres", DefaultOnly=True)
    assert default["DBEngineVersions"][0]["DBParameterGroupFamily"] == "postgres16"
    rds.create_db_parameter_group(
        DBParameterGroupName=group, DBParameterGroupFamily="postgres16", Description="d"
    )
    listed = parameters(rds, group)
    assert listed["work_mem"] == ("4096", "engine-default", "dynamic")
    assert listed["max_connections"][2] == "static"
    assert parameters(rds, group, "user") == {}

    unknown = [{"ParameterName": "no_such", "ParameterValue": "1", "ApplyMethod": "immediate"}]
    assert error_of(
        rds.modify_db_parameter_group, DBParameterGroupName=group, Parameters=unknown
    ) == ("InvalidParameterValue", 400)
    static_now = [
        {"ParameterName": "max_connections", "ParameterValue": "9", "ApplyMethod": "immediate"}
    ]
    assert error_of(
        rds.modify_db_parameter_group, DBParameterGroupName=group, Parameters=static_now
    ) == ("InvalidParameterCombination", 400)

    rds.modify_db_parameter_group(
        DBParameterGroupName=group,
        Parameters=[
            {"ParameterName": "work_mem", "ParameterValue": "8192", "ApplyMethod": "immediate"}
        ],
    )
    assert parameters(rds, group, "user") == {"work_mem": ("8192", "user", "dynamic")}
    rds.reset_db_parameter_group(
        DBParameterGroupName=group,
        Parameters=[{"ParameterName": "work_mem", "ApplyMethod": "immediate"}],
    )
    assert parameters(rds, group, "user") == {}
    assert parameters(rds, group)["work_mem"][0] == "4096"
    assert (
        error_of(
            rds.reset_db_parameter_group, DBParameterGroupName=name("none"), ResetAllParameters=True
        )[0]
        == "DBParameterGroupNotFound"
    )


def test_a_static_change_waits_for_the_reboot_which_takes_a_while(proxy):
    rds, group, ident = client("rds", proxy.url), name("pg"), name("db")
    rds.create_db_parameter_group(
        DBParameterGroupName=group, DBParameterGroupFamily="postgres16", Description="d"
    )
    rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        EngineVersion="16.3",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="not-a-real-password-1",
        DBParameterGroupName=group,
    )
    db_states(rds, ident, "available")
    assert apply_status(rds, ident) == "in-sync"
    rds.modify_db_parameter_group(
        DBParameterGroupName=group,
        Parameters=[
            {
                "ParameterName": "max_connections",
                "ParameterValue": "200",
                "ApplyMethod": "pending-reboot",
            }
        ],
    )
    assert apply_status(rds, ident) == "pending-reboot"
    assert rds.reboot_db_instance(DBInstanceIdentifier=ident)["DBInstance"]["DBInstanceStatus"] == (
        "rebooting"
    )
    assert error_of(rds.reboot_db_instance, DBInstanceIdentifier=ident) == (
        "InvalidDBInstanceState",
        400,
    )
    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["rebooting", "available"]
    assert apply_status(rds, ident) == "in-sync"


def test_another_group_given_to_an_instance_applies_at_its_reboot(proxy):
    rds, group, ident = client("rds", proxy.url), name("pg"), name("db")
    create_db(rds, ident)
    db_states(rds, ident, "available")
    rds.create_db_parameter_group(
        DBParameterGroupName=group, DBParameterGroupFamily="postgres9.3", Description="d"
    )
    rds.modify_db_instance(DBInstanceIdentifier=ident, DBParameterGroupName=group)
    assert apply_status(rds, ident) == "pending-reboot"
    rds.reboot_db_instance(DBInstanceIdentifier=ident)
    db_states(rds, ident, "available")
    assert apply_status(rds, ident) == "in-sync"
