"""spec.parameters: RdsClient and its DB parameter group against moto's server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.kinds import rds_parameters
from provisioner.kinds.rds import KIND, RdsClient

pytestmark = pytest.mark.cloud

SPEC = {
    "engine": "postgres",
    "engineVersion": "16.3",
    "instanceClass": "db.t3.micro",
    "parameters": {"work_mem": "8192", "log_min_duration_statement": "500"},
}
SECRETS = {"password": "not-a-real-password-123"}


def _group(aws, name):
    rds = aws.client("rds")
    found = rds.describe_db_parameter_groups(DBParameterGroupName=name)["DBParameterGroups"][0]
    tags = rds.list_tags_for_resource(ResourceName=found["DBParameterGroupArn"])["TagList"]
    values = {
        p["ParameterName"]: p["ParameterValue"]
        for p in rds.describe_db_parameters(DBParameterGroupName=name)["Parameters"]
    }
    return found, {t["Key"]: t["Value"] for t in tags}, values


def test_the_group_is_made_tagged_attached_corrected_and_deleted_after_the_instance(
    aws, make_resource
):
    rds = RdsClient(aws)
    res = make_resource("DatabaseInstance", SPEC, deletion_policy="Delete")
    name = rds_parameters.group_name(res)
    absent = rds.observe(res)
    assert not absent.exists and absent.status == {"parameterGroup": name, "subnetGroup": None}

    created = rds.create(res, SECRETS)
    assert created is not None and created.status["parameterGroup"] == name
    group, tags, values = _group(aws, name)
    assert group["DBParameterGroupFamily"] == "postgres16"
    assert tags == res.desired_tags
    assert values == dict(SPEC["parameters"])
    obs = rds.observe(res)
    assert rds_parameters.attached(obs.client_state["instance"])[0] == name
    assert obs.diffs == []

    # Out of band: one value changed. Drift on spec.parameters, corrected by update.
    aws.client("rds").modify_db_parameter_group(
        DBParameterGroupName=name,
        Parameters=[
            {"ParameterName": "work_mem", "ParameterValue": "1", "ApplyMethod": "immediate"}
        ],
    )
    obs = rds.observe(res)
    assert [d.field for d in obs.diffs] == ["spec.parameters"]
    assert obs.diffs[0].observed["parameters"]["work_mem"] == "1"
    rds.update(res, obs, obs.diffs)
    assert _group(aws, name)[2]["work_mem"] == "8192"
    assert rds.observe(res).diffs == []

    # The group cannot go while the instance is there; afterwards it does.
    res = replace(res, status={"parameterGroup": name})
    rds.delete(res, rds.observe(res))
    assert not rds.observe(res).exists
    assert rds.remove_leftovers(res, rds.observe(res)) == ""
    assert rds.remove_leftovers(res, rds.observe(res)) == ""  # gone already: nothing to do
    assert [g for g in KIND.list_resources(aws, "us-east-1") if g.name == name] == []


def test_a_reboot_request_is_a_diff_until_handled_and_none_at_creation(aws, make_resource):
    rds = RdsClient(aws)
    key = "cloud.provisioner.dev/reboot-requested-at"
    res = make_resource("DatabaseInstance", SPEC, deletion_policy="Delete")
    res = replace(res, annotations={key: "t1"})
    created = rds.create(res, SECRETS)
    assert created is not None
    assert created.status["lastRebootRequest"] == "t1"
    assert [d.field for d in created.diffs] == []
    res = replace(res, annotations={key: "t2"}, status={"lastRebootRequest": "t1"})
    obs = rds.observe(res)
    assert [(d.field, d.observed, d.desired) for d in obs.diffs] == [("reboot", "t1", "t2")]
    rds.update(res, obs, obs.diffs)  # moto's RebootDBInstance: accepted
    res = replace(res, status={"lastRebootRequest": "t2", "parameterGroup": "x"})
    assert rds.observe(res).diffs == []
    rds.delete(res, rds.observe(res))


def test_leaks_lists_our_groups_with_their_owner(aws, make_resource):
    rds = RdsClient(aws)
    res = make_resource("DatabaseInstance", SPEC, deletion_policy="Delete")
    rds.create(res, SECRETS)
    name = rds_parameters.group_name(res)
    listed = {g.name: g for g in KIND.list_resources(aws, "us-east-1")}
    assert listed[name].kind == "DBParameterGroup"
    assert listed[name].owner_uid == res.uid
    rds.delete(res, rds.observe(res))
    recorded = replace(res, status={"parameterGroup": name})
    assert rds.remove_leftovers(recorded, rds.observe(recorded)) == ""
