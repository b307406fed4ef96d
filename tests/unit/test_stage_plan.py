"""Stage plan: what a pass would do, in status.plan, with reads only (no cloud write, no
Secret, no status pin, observedGeneration kept); and applying after a plan says where the
cloud now differs from what the plan said."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from provisioner import API_VERSION
from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ADOPTABLE_BY_TAG, FieldDiff, Observation
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.dependencies import Dependencies
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.outcome import Event, Result, Verdict
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.plan import Planner, action, against_plan, shown
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from provisioner.runtime.handlers import _outcome
from tests.unit.fakes import FakeCloud, FakeKube

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
NS, DLQ = "team-a", "orders-dlq"
VIS = "spec.visibilityTimeoutSeconds"
PLAN_ONLY = {annotation_keys.PLAN_ONLY: "true"}


class ClockKube(FakeKube):
    def server_now(self) -> datetime:
        return NOW


class World:
    def __init__(self) -> None:
        self.kube = ClockKube()
        self.cloud = FakeCloud("Queue", journal=self.kube.journal)
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        clients: dict[str, Any] = {"Queue": self.cloud}
        placement = Placement(SETTINGS, None, None, self.workers, self.states)
        self.planner = Planner(
            self.kube,  # type: ignore[arg-type]
            placement,
            Dependencies(self.kube, self.workers),  # type: ignore[arg-type]
            Observer(clients, self.workers, self.states),
        )

    def plan(self, r: Resource) -> tuple[Result, Resource]:
        return asyncio.run(self.planner.plan(r))

    def nothing_written(self) -> None:
        assert self.cloud.writes() == []
        assert self.kube.status_patches == [] and self.kube.secret_writes == []


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


def resource(
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    generation: int = 2,
) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {
            "namespace": NS,
            "name": "orders",
            "uid": "uid-orders",
            "generation": generation,
            "annotations": PLAN_ONLY if annotations is None else annotations,
        },
        "spec": spec or {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def plan_of(result: Result) -> dict[str, Any]:
    plan: dict[str, Any] = result.fields["plan"]
    return plan


# -- action --------------------------------------------------------------------------------


def test_action():
    r = resource()
    assert action(r, Observation(exists=False)) == "Create"
    assert action(r, Observation(exists=True, owner_uid="someone-else")) == "Blocked"
    assert action(r, Observation(exists=True, owner_uid=r.uid)) == "None"
    diff = FieldDiff(VIS, 30, 60)
    assert action(r, Observation(exists=True, owner_uid=r.uid, diffs=[diff])) == "Update"


def test_shown():
    assert shown("text") == "text"
    assert shown(60) == "60"
    assert shown({"a": [1, None]}) == '{"a": [1, null]}'


# -- Planner.plan ------------------------------------------------------------------------


def test_a_plan_to_create(world):
    r = resource()
    result, placed = world.plan(r)
    plan = plan_of(result)
    assert plan == {
        "action": "Create",
        "reason": f"create Queue {r.external_name} in the operator's own account, us-east-1",
        "changes": [],
        "generation": 2,
        "plannedAt": "2030-01-02T03:04:05Z",
    }
    assert placed == r
    assert [(c.type, c.status, c.reason) for c in result.conditions] == [
        (cond.READY, False, cond.PLAN_ONLY),
        (cond.SYNCED, False, cond.PLAN_ONLY),
    ]
    assert annotation_keys.PLAN_ONLY in result.conditions[1].message
    assert result.verdict is Verdict.PLANNED
    assert result.for_generation is False
    assert result.requeue_after is None
    world.nothing_written()


def test_a_plan_to_update_lists_each_change(world):
    r = resource({"visibilityTimeoutSeconds": 60})
    world.cloud.seed(r, fields={VIS: 30})
    result, _ = world.plan(r)
    plan = plan_of(result)
    assert plan["action"] == "Update"
    assert plan["reason"] == f"update {r.external_name}: {VIS}"
    assert plan["changes"] == [{"field": VIS, "cloud": "30", "spec": "60"}]
    world.nothing_written()


def test_a_plan_under_report_only_says_so(world):
    annotations = {**PLAN_ONLY, annotation_keys.DRIFT_POLICY: "report"}
    r = resource({"visibilityTimeoutSeconds": 60}, annotations)
    world.cloud.seed(r, fields={VIS: 30})
    result, _ = world.plan(r)
    assert plan_of(result)["reason"].endswith(
        "(drift-policy report: only the fields changed in the spec are written)"
    )


def test_a_plan_with_nothing_to_do(world):
    r = resource()
    world.cloud.seed(r)
    result, _ = world.plan(r)
    assert plan_of(result)["action"] == "None"
    assert plan_of(result)["reason"] == f"{r.external_name} matches the spec: nothing to do"


def test_a_plan_blocked_by_another_owner_shows_no_uid(world):
    r = resource()
    world.cloud.seed(r, owner="other")
    result, _ = world.plan(r)
    plan = plan_of(result)
    assert plan["action"] == "Blocked"
    assert "left untouched" in plan["reason"]
    assert "someone-else" not in str(result)
    world.nothing_written()


def test_a_plan_to_adopt_is_an_update(world):
    annotations = {**PLAN_ONLY, annotation_keys.ADOPT: "true"}
    r = resource({"queueName": "legacy"}, annotations)
    world.cloud.seed(r, owner="none", tags={ADOPTABLE_BY_TAG: NS})
    result, _ = world.plan(r)
    assert plan_of(result)["action"] == "Update"
    assert [c["field"] for c in plan_of(result)["changes"]] == ["tags"]


def test_a_plan_waits_for_a_dependency_without_looking_at_the_cloud(world):
    r = resource({"deadLetter": {"queueRef": {"name": DLQ}}})
    result, _ = world.plan(r)
    assert plan_of(result)["action"] == "Blocked"
    assert plan_of(result)["reason"] == f"waiting for dead-letter Queue {DLQ} to be Ready"
    assert world.cloud.calls == []


def test_a_plan_with_a_ready_dependency_looks_at_the_cloud(world):
    world.kube.resources[("Queue", NS, DLQ)] = {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"namespace": NS, "name": DLQ, "uid": "dlq"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "arn": "arn:dlq"},
    }
    result, _ = world.plan(resource({"deadLetter": {"queueRef": {"name": DLQ}}}))
    assert plan_of(result)["action"] == "Create"


def test_a_plan_compares_with_the_dependencies_arns_as_a_pass_does(world):
    world.kube.resources[("Queue", NS, DLQ)] = {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"namespace": NS, "name": DLQ, "uid": "dlq"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "arn": "arn:dlq"},
    }
    r = resource({"deadLetter": {"queueRef": {"name": DLQ}}})
    # The redrive policy in the cloud is what the spec asks for: nothing to change.
    world.cloud.seed(dataclasses.replace(r, resolved={"deadLetterArn": "arn:dlq"}))
    result, _ = world.plan(r)
    assert plan_of(result)["action"] == "None"
    assert plan_of(result)["changes"] == []


def test_a_plan_the_cloud_could_not_observe_is_blocked(world):
    world.cloud.script.fail("observe", errors.RetryableError("Rate exceeded", "Throttling"))
    result, _ = world.plan(resource())
    plan = plan_of(result)
    assert plan["action"] == "Blocked"
    assert plan["reason"] == "the cloud could not be observed: Throttling: Rate exceeded"
    assert result.verdict is Verdict.PLANNED


def test_a_plan_in_an_account_it_may_not_use_is_blocked(world):
    result, _ = world.plan(resource({"account": "team-b"}))
    plan = plan_of(result)
    assert plan["action"] == "Blocked"
    assert plan["reason"].startswith(f"{cond.ACCOUNT_NOT_FOUND}: CloudAccount team-b")
    assert world.cloud.calls == []


def test_ready_stays_as_status_shows_it(world):
    ready = {"type": cond.READY, "status": "True", "reason": cond.AVAILABLE, "message": "ok"}
    result, _ = world.plan(resource(status={"conditions": [ready]}))
    assert [c.type for c in result.conditions] == [cond.SYNCED]


def test_a_plan_is_counted_as_the_runtime_counts_it(world):
    result, _ = world.plan(resource())
    assert result.verdict.metric_label(False) == _outcome(result)


# -- against_plan --------------------------------------------------------------------------


def planned_resource(plan: dict[str, Any], generation: int = 2) -> Resource:
    return resource(annotations={}, status={"plan": plan}, generation=generation)


def mine(r: Resource, *diffs: FieldDiff) -> Observation:
    return Observation(exists=True, owner_uid=r.uid, diffs=list(diffs))


UPDATE_PLAN = {
    "action": "Update",
    "generation": 2,
    "changes": [{"field": VIS, "cloud": "30", "spec": "60"}],
}


def test_as_planned_nothing_is_said():
    r = planned_resource(UPDATE_PLAN)
    assert against_plan(r, mine(r, FieldDiff(VIS, 30, 60))) == []
    create = planned_resource({"action": "Create", "generation": 2, "changes": []})
    assert against_plan(create, Observation(exists=False)) == []


def test_a_spec_changed_since_the_plan_is_said():
    r = planned_resource(UPDATE_PLAN, generation=3)
    [event] = against_plan(r, mine(r, FieldDiff(VIS, 30, 60)))
    assert event == Event(
        "Warning", "PlanChanged", "the spec changed since (planned generation 2, now 3)"
    )


def test_another_action_than_planned_is_said():
    r = planned_resource(UPDATE_PLAN)
    [event] = against_plan(r, mine(r))
    assert event.message == "the plan said Update, the cloud now needs None"
    [blocked] = against_plan(r, Observation(exists=True, owner_uid="someone-else"))
    assert blocked.message == "the plan said Update, the cloud now needs Blocked"


def test_other_changes_than_planned_are_said():
    r = planned_resource(UPDATE_PLAN)
    [event] = against_plan(r, mine(r, FieldDiff(VIS, 30, 60), FieldDiff("tags", {}, {"a": "b"})))
    assert event.message == f"the plan changed ['{VIS}'], now ['{VIS}', 'tags']"
    # The same field now going to another value is another change too.
    [value] = against_plan(r, mine(r, FieldDiff(VIS, 30, 90)))
    assert value.type == "Warning" and value.reason == "PlanChanged"


def test_every_difference_is_said_in_one_event():
    r = planned_resource(UPDATE_PLAN, generation=5)
    [event] = against_plan(r, Observation(exists=False))
    assert event.message == (
        "the spec changed since (planned generation 2, now 5); "
        "the plan said Update, the cloud now needs Create"
    )
