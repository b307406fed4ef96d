"""spec.parameters without a cloud: names, families, what a look reports, and the reconciler's
two seams for it (a deletion waits for what outlives the resource; a reboot request is done
once per value, whatever the drift policy)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.kinds import rds_parameters
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import naming
from provisioner.model.resource import Resource
from provisioner.reconciler.requested import NOTHING_REQUESTED
from tests.unit.test_stage_converge import World as ConvergeWorld
from tests.unit.test_stage_converge import progress
from tests.unit.test_stage_converge import resource as make
from tests.unit.test_stage_delete import World as DeleteWorld
from tests.unit.test_stage_delete import resource as queue_resource

REBOOT = "cloud.provisioner.dev/reboot-requested-at"
VALID_GROUP = re.compile(r"^[a-z](-?[a-z0-9])*$")


def database(
    parameters: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> Resource:
    spec: dict[str, Any] = {"engine": "postgres", "instanceClass": "db.t3.micro"}
    if parameters is not None:
        spec["parameters"] = parameters
    body = {
        "kind": "DatabaseInstance",
        "metadata": {
            "namespace": "team-a",
            "name": "orders",
            "uid": "uid-1",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def instance(group: str, apply_status: str = "in-sync") -> dict[str, Any]:
    return {
        "DBInstanceStatus": "available",
        "DBParameterGroups": [
            {"DBParameterGroupName": group, "ParameterApplyStatus": apply_status}
        ],
    }


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("team-a", "orders"), ("9ns", "x"), ("a" * 63, "b" * 253), ("--", "__")],
)
def test_group_names_are_valid_deterministic_and_keep_the_uid_hash(namespace, name):
    made = naming.db_parameter_group_name(namespace, name, "uid-1")
    assert made == naming.db_parameter_group_name(namespace, name, "uid-1")
    assert len(made) <= 255 and VALID_GROUP.match(made), made
    assert made.endswith(naming.uid_hash("uid-1"))
    assert made != naming.db_parameter_group_name(namespace, name, "uid-2")


@pytest.mark.parametrize(
    ("engine", "version", "family"),
    [
        ("postgres", "16.3", "postgres16"),
        ("postgres", "16", "postgres16"),
        ("postgres", "9.6.22", "postgres9.6"),
        ("mysql", "8.0.35", "mysql8.0"),
        ("mariadb", "10.11.6", "mariadb10.11"),
    ],
)
def test_the_family_follows_engine_and_major_version(engine, version, family):
    assert rds_parameters.family(engine, version) == family


def test_parsed_sorted_and_none_apart_from_empty():
    assert database().spec.parameters is None
    assert database({}).spec.parameters == ()
    assert database({"b": "2", "a": "1"}).spec.parameters == (("a", "1"), ("b", "2"))


def test_no_parameters_no_group_no_call():
    r = database()
    assert rds_parameters.read(None, None, r, instance("default.postgres16")) == {}
    assert rds_parameters.absent_status(r) == {}
    assert rds_parameters.diffs(r, {}) == []


def test_an_instance_on_another_group_is_a_diff_and_all_parameters_wait_for_a_reboot():
    r = database({"work_mem": "8192"})
    looked = rds_parameters.read(None, None, r, instance("default.postgres16"))
    [diff] = rds_parameters.diffs(r, looked)
    ours = rds_parameters.group_name(r)
    assert diff.observed == {"parameterGroup": "default.postgres16", "parameters": {}}
    assert diff.desired == {"parameterGroup": ours, "parameters": {"work_mem": "8192"}}
    status = rds_parameters.status(r, looked)
    assert status == {"parameterGroup": ours, "pendingReboot": ["work_mem"]}


def test_pending_reboot_keeps_what_was_recorded_until_the_cloud_has_applied_it():
    r = database({"max_connections": "200"}, status={"pendingReboot": ["max_connections"]})
    ours = rds_parameters.group_name(r)
    same = {"max_connections": "200"}
    looked = {"inUse": ours, "applyStatus": "pending-reboot", "values": same, "static": []}
    assert rds_parameters.status(r, looked)["pendingReboot"] == ["max_connections"]
    looked["applyStatus"] = "in-sync"
    assert rds_parameters.status(r, looked)["pendingReboot"] is None
    # A static one about to change: recorded before the write.
    looked["values"] = {"max_connections": "100"}
    looked["static"] = ["max_connections"]
    assert rds_parameters.status(r, looked)["pendingReboot"] == ["max_connections"]


def test_a_reboot_is_asked_by_a_new_value_only_and_never_at_creation():
    asked = {REBOOT: "t2"}
    r = database(annotations=asked, status={"lastRebootRequest": "t1"})
    assert rds_parameters.diffs(r, {}) == [FieldDiff("reboot", "t1", "t2")]
    done = database(annotations=asked, status={"lastRebootRequest": "t2"})
    assert rds_parameters.diffs(done, {}) == []
    fresh = database({"a": "1"}, annotations=asked)
    obs = rds_parameters.after_create(
        fresh, Observation(exists=True, diffs=rds_parameters.diffs(fresh, {}))
    )
    assert obs.diffs == [] and obs.status["lastRebootRequest"] == "t2"
    assert obs.status["parameterGroup"] == rds_parameters.group_name(fresh)


def test_a_batched_describe_stands_in_only_for_instances_on_default_groups():
    assert rds_parameters.batchable(instance("default.postgres16"))
    assert rds_parameters.batchable({})
    assert not rds_parameters.batchable(instance("team-a-orders-params-1234abcd"))


def test_an_unknown_name_is_named_from_the_listing_or_the_refusal():
    r = database({"work_mem": "1", "no_such": "1"})
    listing = [{"ParameterName": "work_mem", "ApplyType": "dynamic"}]
    with pytest.raises(errors.TerminalError, match="no_such is no parameter"):
        rds_parameters.check_names(r, listing)
    # moto lists only what was set, with no ApplyType: nothing to tell from it.
    assert rds_parameters.check_names(r, [{"ParameterName": "work_mem"}]) == {"work_mem": ""}
    refusal = errors.TerminalError(
        "Could not find parameter with name: no_such", "InvalidParameterValue"
    )
    named = rds_parameters._unknown(refusal, ["no_such", "work_mem"])
    assert "no_such is no parameter" in str(named)


class Leftovers:
    """A cloud whose resource is gone and that still removes something beside it."""

    def __init__(self, world: DeleteWorld, waits: int) -> None:
        self.world, self.waits = world, waits

    def remove_leftovers(self, resource: Resource, observation: Observation) -> str:
        self.world.journal.append(("cloud", "remove_leftovers", resource.name))
        if self.waits:
            self.waits -= 1
            return "deleting DB parameter group x: still in use"
        return ""


def test_a_deletion_waits_for_what_outlives_the_resource():
    world = DeleteWorld()
    try:
        cloud = world.cloud
        left = Leftovers(world, waits=1)
        cloud.remove_leftovers = left.remove_leftovers
        r = queue_resource()
        first = asyncio.run(world.deletion.delete(r, 0))
        assert not first.release_finalizer
        assert "still in use" in first.conditions[0].message
        second = asyncio.run(world.deletion.delete(r, 1))
        assert second.release_finalizer
        assert [j for j in world.journal if j[1] == "remove_leftovers"] == [
            ("cloud", "remove_leftovers", "orders"),
            ("cloud", "remove_leftovers", "orders"),
        ]
    finally:
        world.workers.executor.shutdown(wait=True)
        world.workers.look_executor.shutdown(wait=True)


def test_a_reboot_request_is_written_under_report_and_recorded_right_after():
    world = ConvergeWorld()
    try:
        r = make(
            "DatabaseInstance",
            {"engine": "postgres", "instanceClass": "db.t3.micro"},
            annotations={"cloud.provisioner.dev/drift-policy": "report", REBOOT: "t1"},
        )
        world.clouds["DatabaseInstance"].seed(r)
        asked = FieldDiff("reboot", "", "t1")
        drift = FieldDiff("spec.instanceClass", "db.t3.small", "db.t3.micro")
        p = progress(r, requested=NOTHING_REQUESTED)
        world.apply(p, Observation(exists=True, diffs=[asked, drift]))
        [update] = [c for c in world.clouds["DatabaseInstance"].calls if c.method == "update"]
        # The request is written; the drift, under report, is not.
        assert update.fields == {"reboot": "t1"}
        assert r.status["lastRebootRequest"] == "t1"
        assert world.kube.status_patches[-1][-1] == {"lastRebootRequest": "t1"}
    finally:
        world.workers.executor.shutdown(wait=True)
        world.workers.look_executor.shutdown(wait=True)
