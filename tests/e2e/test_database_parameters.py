"""DatabaseInstance.spec.parameters: a DB parameter group of the operator's own, end to end.

Against moto (the session operator): the group made with our tags before the instance and
attached at create, changes and out-of-band drift corrected (or only reported), plan-only,
a SIGKILL between the group and the instance, the group deleted after the instance.

Against the aws-like cloud in front of moto (an operator of the test's own): moto stores any
parameter and knows no ApplyType, no ResetDBParameterGroup and no DescribeDBEngineVersions;
the aws-like cloud plays them (provisioner_dev/awslike_rds_parameters.py), and the reboot
(`rebooting`, then the static parameters applied).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from tests.conftest import TEST_CLOUD, TEST_RESYNC_SECONDS
from tests.e2e.test_awslike import Cloud, aws_like  # noqa: F401 - the aws-like fixture
from tests.e2e.test_crash_safety import wait_killed
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    merge_patch,
    owned_cloud_resources,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

GROUP = "cloud.provisioner.dev"
REBOOT = f"{GROUP}/reboot-requested-at"


def database(
    name: str,
    parameters: dict[str, str] | None,
    annotations: dict[str, str] | None = None,
    **extra: Any,
) -> str:
    spec: dict[str, Any] = {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "deletionPolicy": "Delete",
        **extra,
    }
    if parameters is not None:
        spec["parameters"] = parameters
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "DatabaseInstance",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": spec,
    }
    return yaml.safe_dump(body)


def group_values(rds: Any, name: str) -> dict[str, str]:
    """The parameters set in the group (moto lists only those; AWS's Source `user`)."""
    found = rds.describe_db_parameters(DBParameterGroupName=name, Source="user")["Parameters"]
    return {
        p["ParameterName"]: p["ParameterValue"] for p in found if p.get("Source", "user") == "user"
    }


def group_tags(rds: Any, name: str) -> dict[str, str]:
    group = rds.describe_db_parameter_groups(DBParameterGroupName=name)["DBParameterGroups"][0]
    tags = rds.list_tags_for_resource(ResourceName=group["DBParameterGroupArn"])["TagList"]
    return {t["Key"]: t["Value"] for t in tags}


def group_exists(rds: Any, name: str) -> bool:
    """(moto answers an empty list where AWS says DBParameterGroupNotFound)"""
    try:
        found = rds.describe_db_parameter_groups(DBParameterGroupName=name)
    except rds.exceptions.DBParameterGroupNotFoundFault:
        return False
    return bool(found["DBParameterGroups"])


def instance(rds: Any, identifier: str) -> dict[str, Any]:
    return rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]


def set_out_of_band(rds: Any, group: str, name: str, value: str) -> None:
    rds.modify_db_parameter_group(
        DBParameterGroupName=group,
        Parameters=[{"ParameterName": name, "ParameterValue": value, "ApplyMethod": "immediate"}],
    )


# ---------------------------------------------------------------------------------------------
# Against moto.


def test_group_made_attached_changed_corrected_and_deleted_after_the_instance(
    kube, operator, aws, namespace
):
    params = {"work_mem": "8192", "log_min_duration_statement": "500"}
    apply(kube, namespace, database("tuned", params, engineVersion="16.3"))
    cr = wait_ready(kube, "dbi", namespace, "tuned", timeout=90)
    status, uid = cr["status"], cr["metadata"]["uid"]
    group = status["parameterGroup"]
    assert group.startswith(f"{namespace}-tuned-params-")
    found = aws.rds.describe_db_parameter_groups(DBParameterGroupName=group)["DBParameterGroups"]
    assert found[0]["DBParameterGroupFamily"] == "postgres16"
    tags = group_tags(aws.rds, group)
    assert tags["provisioner.dev/owner-uid"] == uid and tags["provisioner.dev/cluster"] == "test"
    assert group_values(aws.rds, group) == params
    attached = instance(aws.rds, status["externalName"])["DBParameterGroups"]
    assert [g["DBParameterGroupName"] for g in attached] == [group]
    assert "pendingReboot" not in status
    owned = sorted(owned_cloud_resources(aws, uid))
    assert owned == [("DBParameterGroup", group), ("DatabaseInstance", status["externalName"])]

    # A change in the spec: written to the group.
    merge_patch(kube, "dbi", namespace, "tuned", '{"spec":{"parameters":{"work_mem":"16384"}}}')
    wait_ready(kube, "dbi", namespace, "tuned", generation=2, timeout=60)
    assert group_values(aws.rds, group)["work_mem"] == "16384"

    # Out of band: corrected, and named as drift.
    set_out_of_band(aws.rds, group, "work_mem", "1")
    wait_for(
        lambda: group_values(aws.rds, group)["work_mem"] == "16384",
        timeout=60,
        what="the drifted parameter put back",
    )
    drifted = wait_for(
        lambda: events(kube, namespace, "tuned", "Drifted"), timeout=30, what="a Drifted Event"
    )
    assert "corrected: spec.parameters" in drifted[-1]["message"]

    # Deleted: the instance, then its group; the finalizer only after both.
    kube.kubectl("delete", "dbi", "tuned", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "tuned", timeout=90)
    assert not group_exists(aws.rds, group)
    assert owned_cloud_resources(aws, uid) == []


def test_drift_is_only_reported_under_report_and_plan_only_lists_the_change(
    kube, operator, aws, namespace
):
    manifest = database(
        "reported",
        {"work_mem": "8192"},
        engineVersion="16.3",
        annotations={f"{GROUP}/drift-policy": "report"},
    )
    apply(kube, namespace, manifest)
    cr = wait_ready(kube, "dbi", namespace, "reported", timeout=90)
    group = cr["status"]["parameterGroup"]
    set_out_of_band(aws.rds, group, "work_mem", "1")
    cr = wait_condition(
        kube, "dbi", namespace, "reported", "Drifted", "True", "DriftReported", timeout=60
    )
    assert "spec.parameters" in condition(cr, "Drifted")["message"]
    assert group_values(aws.rds, group)["work_mem"] == "1"

    # plan-only: the change listed, nothing written.
    kube.kubectl("annotate", "dbi", "reported", "-n", namespace, f"{GROUP}/plan-only=true")
    merge_patch(
        kube, "dbi", namespace, "reported", '{"spec":{"parameters":{"statement_timeout":"30000"}}}'
    )

    def planned() -> dict[str, Any] | None:
        plan = ((get(kube, "dbi", namespace, "reported") or {}).get("status") or {}).get("plan")
        if plan and plan.get("generation") == 2:
            return plan
        return None

    plan = wait_for(planned, timeout=60, what="a plan for generation 2")
    assert plan["action"] == "Update"
    change = next(c for c in plan["changes"] if c["field"] == "spec.parameters")
    spec = json.loads(change["spec"])
    assert spec["parameters"] == {"statement_timeout": "30000", "work_mem": "8192"}
    assert json.loads(change["cloud"])["parameters"] == {"work_mem": "1"}
    assert "statement_timeout" not in group_values(aws.rds, group)

    # Applied: the requested change is written (and, under report, the drift with it: the
    # whole map is the field the user changed).
    kube.kubectl("annotate", "dbi", "reported", "-n", namespace, f"{GROUP}/plan-only-")
    wait_ready(kube, "dbi", namespace, "reported", generation=2, timeout=60)
    assert group_values(aws.rds, group) == {"work_mem": "8192", "statement_timeout": "30000"}
    kube.kubectl("delete", "dbi", "reported", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "reported", timeout=90)
    assert not group_exists(aws.rds, group)


def test_adoption_gives_the_instance_its_group_with_no_drift_reported(
    kube, operator, aws, namespace
):
    ident = f"legacy-{namespace}"
    aws.rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        EngineVersion="16.3",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="not-a-real-password-123",
        Tags=[{"Key": "provisioner.dev/adoptable-by", "Value": namespace}],
    )
    manifest = database(
        "legacy",
        {"work_mem": "8192"},
        annotations={f"{GROUP}/adopt": "true"},
        engineVersion="16.3",
        instanceIdentifier=ident,
    )
    apply(kube, namespace, manifest)
    cr = wait_ready(kube, "dbi", namespace, "legacy", timeout=90)
    group = cr["status"]["parameterGroup"]
    attached = instance(aws.rds, ident)["DBParameterGroups"]
    assert [g["DBParameterGroupName"] for g in attached] == [group]
    assert group_values(aws.rds, group) == {"work_mem": "8192"}
    assert events(kube, namespace, "legacy", "Adopted")
    assert not events(kube, namespace, "legacy", "Drifted")
    assert condition(cr, "Drifted") is None
    kube.kubectl("delete", "dbi", "legacy", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "legacy", timeout=90)
    assert not group_exists(aws.rds, group)


@pytest.mark.skipif(TEST_CLOUD != "moto", reason="crash points with moto")
def test_killed_between_the_group_and_the_instance_leaves_no_duplicate_and_no_leak(
    kube, aws, own_namespace, start_operator
):
    # Killed once the group is made: the next operator makes the instance with that group.
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-parameter-group"})
    apply(kube, own_namespace, database("kept", {"work_mem": "8192"}, engineVersion="16.3"))
    wait_killed(doomed)
    cr = get(kube, "dbi", own_namespace, "kept")
    group = cr["status"]["parameterGroup"]  # recorded before it was made
    uid = cr["metadata"]["uid"]
    assert owned_cloud_resources(aws, uid) == [("DBParameterGroup", group)]
    op = start_operator()
    cr = wait_ready(kube, "dbi", own_namespace, "kept", timeout=90)
    owned = sorted(owned_cloud_resources(aws, uid))
    assert owned == [
        ("DBParameterGroup", group),
        ("DatabaseInstance", cr["status"]["externalName"]),
    ]
    op.stop()

    # Killed there again, and the resource deleted while no operator runs: nothing is left.
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-parameter-group"})
    apply(kube, own_namespace, database("dropped", {"work_mem": "8192"}, engineVersion="16.3"))
    wait_killed(doomed)
    dropped = get(kube, "dbi", own_namespace, "dropped")
    dropped_group = dropped["status"]["parameterGroup"]
    assert group_exists(aws.rds, dropped_group)
    kube.kubectl("delete", "dbi", "dropped", "kept", "-n", own_namespace, "--wait=false")
    start_operator()
    wait_gone(kube, "dbi", own_namespace, "dropped", timeout=90)
    wait_gone(kube, "dbi", own_namespace, "kept", timeout=90)
    assert owned_cloud_resources(aws, dropped["metadata"]["uid"]) == []
    assert owned_cloud_resources(aws, uid) == []


def test_parameter_names_are_checked_at_apply(kube, namespace):
    refused = try_apply(kube, namespace, database("badname", {"1st": "x"}), "--dry-run=server")
    assert_refused(refused, "spec.parameters names are DB parameter names")
    accepted = try_apply(
        kube, namespace, database("goodname", {"rds.force_ssl": "1"}), "--dry-run=server"
    )
    assert accepted.returncode == 0, accepted.stderr


# ---------------------------------------------------------------------------------------------
# Against the aws-like cloud.


def pending_reboot(kube, namespace: str, name: str) -> list[str] | None:
    cr = get(kube, "dbi", namespace, name) or {}
    return (cr.get("status") or {}).get("pendingReboot")


def reboot(kube, cloud: Cloud, namespace: str, name: str, value: str) -> dict[str, Any]:
    """Ask for a reboot; the cloud shows `rebooting`, then status.pendingReboot empties."""
    ident = (get(kube, "dbi", namespace, name) or {})["status"]["externalName"]
    kube.kubectl("annotate", "--overwrite", "dbi", name, "-n", namespace, f"{REBOOT}={value}")
    wait_for(lambda: cloud.db_state(ident) == "rebooting", timeout=30, what="rebooting")
    wait_for(
        lambda: not pending_reboot(kube, namespace, name),
        timeout=60,
        what="status.pendingReboot emptied after the reboot",
    )
    return get(kube, "dbi", namespace, name) or {}


def a_pass(kube, namespace: str, name: str, value: str) -> None:
    """A reconcile request, and its pass done."""
    request = f"{GROUP}/reconcile-requested-at={value}"
    kube.kubectl("annotate", "--overwrite", "dbi", name, "-n", namespace, request)

    def done() -> bool:
        status = (get(kube, "dbi", namespace, name) or {}).get("status") or {}
        return status.get("lastReconcileRequest") == value

    wait_for(done, timeout=60, what=f"the pass asked with {value}")


@pytest.mark.skipif(TEST_CLOUD != "moto", reason="the aws-like proxy stands in front of moto")
def test_static_parameters_wait_for_the_reboot_asked_once_per_value(
    kube,
    aws_like,  # noqa: F811 - the fixture imported above
    own_namespace,
    start_operator,
):
    # At 60x: creating 4 s, backing-up 1 s, rebooting 3 s.
    cloud: Cloud = aws_like(60, rds_create=240, rds_backup=60, rds_reboot=180)
    op = start_operator(endpoint_url=cloud.proxy.url)
    # No engineVersion: the family of the engine's default version (DescribeDBEngineVersions).
    apply(kube, own_namespace, database("rebooted", {"work_mem": "8192"}))
    cr = wait_ready(kube, "dbi", own_namespace, "rebooted", timeout=90)
    ident, group = cr["status"]["externalName"], cr["status"]["parameterGroup"]
    found = cloud.rds.describe_db_parameter_groups(DBParameterGroupName=group)
    assert found["DBParameterGroups"][0]["DBParameterGroupFamily"] == "postgres16"

    # One static, one dynamic: the static one waits for a reboot, and says so.
    merge_patch(
        kube,
        "dbi",
        own_namespace,
        "rebooted",
        '{"spec":{"parameters":{"work_mem":"16384","max_connections":"200"}}}',
    )
    cr = wait_ready(kube, "dbi", own_namespace, "rebooted", generation=2, timeout=60)
    assert cr["status"]["pendingReboot"] == ["max_connections"]
    assert group_values(cloud.rds, group) == {"work_mem": "16384", "max_connections": "200"}
    applying = instance(cloud.rds, ident)["DBParameterGroups"][0]["ParameterApplyStatus"]
    assert applying == "pending-reboot"
    assert cloud.operator_calls("rds.RebootDBInstance") == 0

    # The annotation asks for the reboot: `rebooting`, then nothing pending.
    cr = reboot(kube, cloud, own_namespace, "rebooted", "t1")
    assert cr["status"]["lastRebootRequest"] == "t1"
    assert cloud.operator_calls("rds.RebootDBInstance") == 1

    # Not again for the same value, after a restart either.
    op.stop()
    start_operator(endpoint_url=cloud.proxy.url)
    a_pass(kube, own_namespace, "rebooted", "after-restart")
    assert cloud.operator_calls("rds.RebootDBInstance") == 1

    # A static parameter removed: reset to its default, at the next reboot.
    merge_patch(
        kube, "dbi", own_namespace, "rebooted", '{"spec":{"parameters":{"max_connections":null}}}'
    )
    cr = wait_ready(kube, "dbi", own_namespace, "rebooted", generation=3, timeout=60)
    assert group_values(cloud.rds, group) == {"work_mem": "16384"}
    assert cr["status"]["pendingReboot"] == ["max_connections"]
    reboot(kube, cloud, own_namespace, "rebooted", "t2")
    assert cloud.operator_calls("rds.RebootDBInstance") == 2

    kube.kubectl("delete", "dbi", "rebooted", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "dbi", own_namespace, "rebooted", timeout=120)
    assert not group_exists(cloud.rds, group)


@pytest.mark.skipif(TEST_CLOUD != "moto", reason="the aws-like proxy stands in front of moto")
def test_unknown_parameter_is_named_and_removing_all_keeps_the_group_without_overrides(
    kube,
    aws_like,  # noqa: F811 - the fixture imported above
    own_namespace,
    start_operator,
):
    cloud: Cloud = aws_like(60, rds_create=240, rds_backup=60)
    start_operator(endpoint_url=cloud.proxy.url)
    apply(kube, own_namespace, database("strict", {"work_mem": "8192"}, engineVersion="16.3"))
    cr = wait_ready(kube, "dbi", own_namespace, "strict", timeout=90)
    ident, group = cr["status"]["externalName"], cr["status"]["parameterGroup"]

    modifies = cloud.operator_calls("rds.ModifyDBParameterGroup")  # the create's
    merge_patch(kube, "dbi", own_namespace, "strict", '{"spec":{"parameters":{"no_such":"1"}}}')
    cr = wait_condition(kube, "dbi", own_namespace, "strict", "Synced", "False", "InvalidSpec")
    assert "no_such" in condition(cr, "Synced")["message"]
    assert "no_such" not in group_values(cloud.rds, group)
    # Not retried in a loop: the refusal stands for this generation (refused before any
    # write: the cloud lists the family's parameters, and no_such is not one of them).
    listings = cloud.operator_calls("rds.DescribeDBParameters")
    time.sleep(3 * TEST_RESYNC_SECONDS)  # a window in which a loop would show, not a wait
    assert cloud.operator_calls("rds.DescribeDBParameters") - listings <= 4
    assert cloud.operator_calls("rds.ModifyDBParameterGroup") == modifies
    merge_patch(kube, "dbi", own_namespace, "strict", '{"spec":{"parameters":{"no_such":null}}}')
    wait_ready(kube, "dbi", own_namespace, "strict", generation=3, timeout=60)

    # spec.parameters removed: the group stays attached, with no parameter of its own.
    merge_patch(kube, "dbi", own_namespace, "strict", '{"spec":{"parameters":null}}')
    cr = wait_ready(kube, "dbi", own_namespace, "strict", generation=4, timeout=60)
    assert cr["status"]["parameterGroup"] == group
    assert group_values(cloud.rds, group) == {}
    attached = instance(cloud.rds, ident)["DBParameterGroups"][0]["DBParameterGroupName"]
    assert attached == group
    kube.kubectl("delete", "dbi", "strict", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "dbi", own_namespace, "strict", timeout=120)
    assert not group_exists(cloud.rds, group)
