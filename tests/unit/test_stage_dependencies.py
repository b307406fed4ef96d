"""Stage dependencies: the ARNs of the resources a resource needs (a Queue's dead-letter
target), once they are Ready and in the same account; until then, the pass waits."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner import API_VERSION
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds import sqs
from provisioner.model import conditions as cond
from provisioner.model.account import AccountRef
from provisioner.model.resource import Dependency, Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler import outcome
from provisioner.reconciler.dependencies import Dependencies, waiting_for
from provisioner.reconciler.outcome import WAIT_CAP, Result, Verdict
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeKube

NS, DLQ = "team-a", "orders-dlq"
DLQ_ARN = "arn:aws:sqs:us-east-1:000000000000:team-a-orders-dlq"
READY = {"type": cond.READY, "status": "True", "reason": cond.AVAILABLE}
NOT_READY = {"type": cond.READY, "status": "False", "reason": cond.CREATING}


class World:
    def __init__(self) -> None:
        self.kube = FakeKube()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, States())
        self.dependencies = Dependencies(self.kube, self.workers)  # type: ignore[arg-type]

    def target(self, status: dict[str, Any], deleting: bool = False) -> None:
        meta: dict[str, Any] = {"namespace": NS, "name": DLQ, "uid": "dlq-uid", "generation": 1}
        if deleting:
            meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
        self.kube.resources[("Queue", NS, DLQ)] = {
            "apiVersion": API_VERSION,
            "kind": "Queue",
            "metadata": meta,
            "spec": {},
            "status": status,
        }

    def resolve(self, r: Resource, retry: int = 0) -> Resource | Result:
        return asyncio.run(self.dependencies.resolve(r, retry))


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


def queue(dead_letter: bool = True, account: AccountRef | None = None) -> Resource:
    spec: dict[str, Any] = {}
    if dead_letter:
        spec["deadLetter"] = {"queueRef": {"name": DLQ}, "maxReceiveCount": 3}
    body = {
        "kind": "Queue",
        "metadata": {"namespace": NS, "name": "orders", "uid": "uid-orders", "generation": 1},
        "spec": spec,
    }
    r = kinds.parse(body, region="us-east-1", cluster_id="test")
    return r if account is None else dataclasses.replace(r, account=account)


TEAM_B = AccountRef("team-b", "222222222222", "arn:aws:iam::222222222222:role/p")


def test_nothing_needed_resolves_at_once(world):
    r = queue(dead_letter=False)
    resolved = world.resolve(r)
    assert isinstance(resolved, Resource)
    assert resolved.resolved == {}
    assert world.kube.journal == []


def test_a_ready_target_gives_its_arn(world):
    world.target({"conditions": [READY], "arn": DLQ_ARN})
    r = queue()
    resolved = world.resolve(r)
    assert isinstance(resolved, Resource)
    assert resolved.resolved == {sqs.DEAD_LETTER_ARN: DLQ_ARN}
    assert r.resolved == {}  # the resource it was given is left as it was


@pytest.mark.parametrize(
    ("status", "deleting", "present"),
    [
        ({}, False, False),  # no such Queue
        ({"conditions": [NOT_READY], "arn": DLQ_ARN}, False, True),
        ({"conditions": [READY]}, False, True),  # Ready, but no ARN recorded
        ({"conditions": [READY], "arn": DLQ_ARN}, True, True),  # going away
    ],
)
def test_the_pass_waits_for_its_target(world, monkeypatch, status, deleting, present):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)
    if present:
        world.target(status, deleting)
    result = world.resolve(queue(), retry=40)
    assert isinstance(result, Result)
    assert [(c.type, c.status, c.reason) for c in result.conditions] == [
        (cond.READY, False, cond.WAITING_FOR_DEPENDENCY),
        (cond.SYNCED, True, cond.RECONCILE_SUCCESS),
    ]
    assert result.conditions[0].message == f"waiting for dead-letter Queue {DLQ} to be Ready"
    assert result.verdict is Verdict.WAITING
    assert result.requeue_after == WAIT_CAP


def test_a_target_in_another_account_is_refused(world):
    world.target({"conditions": [READY], "arn": DLQ_ARN, "account": "team-b"})
    with pytest.raises(AccountRefused) as refused:
        world.resolve(queue())
    assert refused.value.reason == cond.INVALID_SPEC
    assert refused.value.message == (
        f"dead-letter Queue {DLQ} lives in CloudAccount team-b, this resource in the "
        "operator's own account: both must be in one account"
    )


def test_a_target_in_the_same_account_resolves(world):
    world.target({"conditions": [READY], "arn": DLQ_ARN, "account": "team-b"})
    resolved = world.resolve(queue(account=TEAM_B))
    assert isinstance(resolved, Resource)
    assert resolved.resolved == {sqs.DEAD_LETTER_ARN: DLQ_ARN}


def test_ready_arn(world):
    dependency = Dependency(sqs.DEAD_LETTER_ARN, "Queue", DLQ, "dead-letter Queue")
    assert asyncio.run(world.dependencies.ready_arn(NS, dependency)) is None
    world.target({"conditions": [READY], "arn": DLQ_ARN})
    assert asyncio.run(world.dependencies.ready_arn(NS, dependency)) == (DLQ_ARN, "")
    assert asyncio.run(world.dependencies.ready_arn("elsewhere", dependency)) is None


def test_waiting_for_backs_off_from_a_quick_start(monkeypatch):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)
    dependency = Dependency("k", "Topic", "news", "Topic")
    assert waiting_for(dependency, 0).requeue_after == outcome.WAIT_BASE
    assert waiting_for(dependency, 40).requeue_after == WAIT_CAP
    assert "Topic news" in waiting_for(dependency, 0).conditions[0].message


def database(status: dict[str, Any]) -> Resource:
    spec = {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "restoreFrom": {"pointInTime": {"sourceRef": {"name": "live"}, "latest": True}},
    }
    body = {
        "kind": "DatabaseInstance",
        "metadata": {"namespace": NS, "name": "clone", "uid": "uid-clone", "generation": 1},
        "spec": spec,
        "status": status,
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def test_a_source_needed_only_to_create_is_waited_for_until_the_resource_exists(world):
    waiting = world.resolve(database({}))
    assert isinstance(waiting, Result)
    assert waiting.conditions[0].message == (
        "waiting for point-in-time source DatabaseInstance live to be Ready"
    )
    assert world.kube.journal == [("kube", "get_resource", "live")]
    made = world.resolve(database({"arn": "arn:aws:rds:us-east-1:000000000000:db:clone"}))
    assert isinstance(made, Resource) and made.resolved == {}
    assert len(world.kube.journal) == 1  # not even read once it exists
