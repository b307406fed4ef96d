"""Stage placement: the account and region a resource acts in, before any cloud call; who
to look at again when a CloudAccount or a namespace changes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused, Directory
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
OWN_ID = "000000000000"
TEAM_A = {
    "metadata": {"name": "team-a", "generation": 1},
    "spec": {
        "accountId": "111111111111",
        "roleArn": "arn:aws:iam::111111111111:role/provisioner",
        "regions": ["eu-west-1", "us-east-1"],
        "defaultRegion": "eu-west-1",
        "namespaceSelector": {"matchLabels": {"team": "a"}},
    },
}
NAMESPACES: dict[str, dict[str, Any]] = {
    "ns-a": {"labels": {"team": "a"}, "annotations": {annotation_keys.DEFAULT_ACCOUNT: "team-a"}},
    "ns-b": {"labels": {"team": "b"}},
}


def directory() -> Directory:
    accounts = {"team-a": TEAM_A}
    return Directory(
        accounts.get,
        lambda n: {"metadata": {"name": n, **NAMESPACES[n]}} if n in NAMESPACES else None,
    )


class World:
    def __init__(self, served: bool = True, own_account: Any = lambda: OWN_ID) -> None:
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        self.directory = directory() if served else None
        self.placement = Placement(SETTINGS, self.directory, own_account, self.workers, self.states)

    def place(self, r: Resource, deleting: bool = False) -> Resource:
        return asyncio.run(self.placement.place(r, deleting))

    def close(self) -> None:
        self.workers.executor.shutdown(wait=True)
        self.workers.look_executor.shutdown(wait=True)


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def unserved() -> Iterator[World]:
    made = World(served=False)
    try:
        yield made
    finally:
        made.close()


def resource(
    namespace: str = "ns-a",
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    uid: str = "uid-q",
) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {"namespace": namespace, "name": "q", "uid": uid, "generation": 1},
        "spec": spec or {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


# -- without CloudAccounts -----------------------------------------------------------------


def test_without_cloudaccounts_a_resource_stays_as_it_is(unserved):
    r = resource()
    assert unserved.place(r) is r
    assert unserved.placement.fields(r) == {}
    assert not unserved.placement.unplaced(r)
    assert unserved.placement.known(r) is r
    assert len(unserved.states) == 0


def test_without_cloudaccounts_naming_one_is_refused(unserved):
    with pytest.raises(AccountRefused) as refused:
        unserved.place(resource(spec={"account": "team-a"}))
    assert refused.value.reason == cond.ACCOUNT_NOT_FOUND
    assert "--accounts=off" in refused.value.message


def test_an_unknown_region_is_refused_before_anything(unserved):
    with pytest.raises(AccountRefused) as refused:
        unserved.place(resource(spec={"region": "xx-nowhere-9"}))
    assert refused.value.reason == cond.INVALID_SPEC


# -- with CloudAccounts ------------------------------------------------------------------


def test_the_namespaces_default_account_and_its_region(world):
    placed = world.place(resource())
    assert placed.account is not None and placed.account.name == "team-a"
    assert placed.region == "eu-west-1"
    assert world.states.of("uid-q").placed == ("ns-a", "team-a")
    assert world.placement.fields(placed) == {
        "account": "team-a",
        "accountId": "111111111111",
        "region": "eu-west-1",
    }


def test_the_operators_own_account(world):
    placed = world.place(resource("ns-b"))
    assert placed.account is None and placed.region == "us-east-1"
    assert world.states.of("uid-q").placed == ("ns-b", "")
    assert world.placement.fields(placed) == {
        "account": "",
        "accountId": OWN_ID,
        "region": "us-east-1",
    }


def test_an_own_account_id_unknown_is_empty():
    def sts() -> str:
        raise errors.CloudError("no STS here")

    made = World(own_account=sts)
    try:
        assert made.placement.fields(resource("ns-b"))["accountId"] == ""
    finally:
        made.close()


def test_a_refusal_records_the_account_refused(world):
    with pytest.raises(AccountRefused) as refused:
        world.place(resource("ns-b", spec={"account": "team-a"}))
    assert refused.value.reason == cond.ACCOUNT_NOT_ALLOWED
    state = world.states.of("uid-q")
    assert state.placed == ("ns-b", "team-a")


def test_affected_by_an_account_or_a_namespace(world):
    world.place(resource("ns-a", uid="in-team-a"))
    world.place(resource("ns-b", uid="own"))
    with pytest.raises(AccountRefused):
        world.place(resource("ns-b", spec={"account": "team-a"}, uid="refused"))
    world.states.of("refused").refused = True
    world.states.of("never-placed")
    assert sorted(world.placement.affected(account="team-a")) == ["in-team-a", "refused"]
    # A namespace's change matters to those using or refused a CloudAccount, not to those
    # in the operator's own account.
    assert world.placement.affected(namespace="ns-b") == ["refused"]
    assert world.placement.affected(namespace="ns-a") == ["in-team-a"]
    world.states.forget("in-team-a")
    assert world.placement.affected(account="team-a") == ["refused"]


def test_known_reads_status_without_a_call(world):
    world.place(resource())  # team-a becomes known
    r = resource(status={"account": "team-a", "region": "us-east-1"})
    known = world.placement.known(r)
    assert known.account is not None and known.account.name == "team-a"
    assert known.region == "us-east-1"
    assert world.placement.known(resource(status={"account": "unknown"})).account is None
    assert world.placement.known(resource()) == resource()


def test_unplaced_once_the_cluster_has_cloudaccounts(world):
    r = resource()
    assert not world.placement.unplaced(r)  # none known yet
    world.place(r)
    assert world.placement.unplaced(r)
    assert not world.placement.unplaced(resource(status={"account": ""}))
