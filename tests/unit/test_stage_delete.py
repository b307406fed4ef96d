"""Stage delete: the deletion policy, access revoked first, the cloud resource until the
cloud says it is gone, then the Secret; a paused resource waits unless its namespace is
being deleted; another owner's resource is never deleted."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model import connection_secret
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler import outcome
from provisioner.reconciler.delete import HELD_CAP, Deletion
from provisioner.reconciler.grants import Grants
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.outcome import WAIT_CAP, Result, Verdict
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.secret import ConnectionSecret
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeCloud, FakeKube, Journal

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
NS, NAME = "team-a", "orders"
SECRET = f"{NAME}-connection"
PAUSE = {annotation_keys.PAUSED: "true"}
LATE = 40


class Access:
    """spec.access as the deletion sees it: what it revokes, in the shared journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def revoke_all(self, resource: Resource) -> list[tuple[str, str, str]]:
        self.journal.append(("access", "revoke_all", resource.name))
        return [("Normal", "AccessRevoked", "ServiceAccount app: access revoked")]


class World:
    def __init__(self, kind: str = "Queue") -> None:
        self.journal: Journal = []
        self.kube = FakeKube(self.journal)
        self.cloud = FakeCloud(kind, journal=self.journal)
        clients: dict[str, Any] = {kind: self.cloud}
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        observer = Observer(clients, self.workers, self.states)
        self.secret = ConnectionSecret(self.kube, self.workers, self.states)  # type: ignore[arg-type]
        self.grants = Grants()
        placement = Placement(SETTINGS, None, None, self.workers, self.states)
        self.deletion = Deletion(
            self.kube,  # type: ignore[arg-type]
            clients,
            self.workers,
            placement,
            observer,
            self.secret,
            self.grants,
        )

    def delete(self, r: Resource, retry: int = 0) -> Result:
        return asyncio.run(self.deletion.delete(r, retry))

    def with_secret(self, r: Resource) -> None:
        self.kube.put_secret(NS, connection_secret.build(r, {"host": "h"}))

    def terminating(self) -> None:
        self.kube.namespaces[NS] = {
            "metadata": {"name": NS, "deletionTimestamp": "2030-01-01T00:00:00Z"},
            "status": {"phase": "Terminating"},
        }


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


@pytest.fixture
def db_world() -> Iterator[World]:
    made = World("DatabaseInstance")
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


@pytest.fixture
def no_jitter(monkeypatch):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)


def resource(
    policy: str = "Delete",
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {
            "namespace": NS,
            "name": NAME,
            "uid": "uid-orders",
            "generation": 2,
            "annotations": annotations or {},
            "deletionTimestamp": "2030-01-01T00:00:00Z",
        },
        "spec": {"deletionPolicy": policy, **(spec or {})},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def events(result: Result) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in result.events]


def shown(result: Result) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in result.conditions}


def done(result: Result) -> bool:
    return result.release_finalizer and result.requeue_after is None and not result.for_generation


# -- the plain way -------------------------------------------------------------------------


def test_delete_removes_the_cloud_resource_then_the_secret(world):
    r = resource()
    world.cloud.seed(r)
    world.with_secret(r)
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Normal", "Deleted")]
    assert world.cloud.objects == {}
    assert world.kube.secrets == {}
    delete = world.journal.index(("cloud", "delete", r.external_name))
    assert delete < world.journal.index(("kube", "delete_secret", SECRET))


def test_what_a_deletion_removes_beyond_the_resource_is_recorded_first(world, monkeypatch):
    recording = dataclasses.replace(kinds.descriptor("Queue"), recorded_status=("made",))
    monkeypatch.setitem(kinds.BY_KIND, "Queue", recording)
    observe = world.cloud.observe

    def observed(r: Resource):
        obs = observe(r)
        obs.status = {"made": ["arn:aws:sns:us-east-1:000000000000:news"]} if obs.exists else {}
        return obs

    monkeypatch.setattr(world.cloud, "observe", observed)
    r = resource()
    world.cloud.seed(r)
    assert done(world.delete(r))
    patch = world.journal.index(("kube", "patch_status", NAME))
    assert patch < world.journal.index(("cloud", "delete", r.external_name))
    made = {"made": ["arn:aws:sns:us-east-1:000000000000:news"]}
    assert world.kube.status_patches == [("Queue", NAME, made)]


def test_nothing_in_the_cloud_is_done_at_once(world):
    r = resource()
    result = world.delete(r)
    assert done(result)
    assert world.cloud.writes() == []
    assert events(result) == [("Normal", "Deleted")]


def test_a_deletion_that_takes_time_waits_for_the_cloud(world, no_jitter):
    r = resource()
    world.cloud.seed(r)
    world.with_secret(r)
    world.cloud.deletion_lingers = 2
    result = world.delete(r, LATE)
    assert not result.release_finalizer
    assert shown(result) == {cond.READY: (False, cond.DELETING)}
    assert result.conditions[0].message == f"deleting {r.external_name} (deleting)"
    assert result.verdict is Verdict.WAITING
    assert result.requeue_after == WAIT_CAP
    assert result.for_generation is False
    assert (NS, SECRET) in world.kube.secrets  # the Secret stays until the resource is gone
    # The next pass does not ask again for what is under way.
    again = world.delete(r)
    assert world.cloud.writes() == ["delete"]
    assert not again.release_finalizer
    assert done(world.delete(r))


# -- policies and guardrails --------------------------------------------------------------


def test_retain_keeps_the_cloud_resource(world):
    r = resource("Retain")
    world.cloud.seed(r)
    world.with_secret(r)
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Normal", "Retained")]
    assert world.cloud.calls == []  # not even a look
    assert r.external_name in world.cloud.objects
    assert world.kube.secrets == {}


def test_paused_holds_the_deletion(world, no_jitter):
    r = resource(annotations=PAUSE)
    world.cloud.seed(r)
    world.with_secret(r)
    result = world.delete(r, LATE)
    assert not result.release_finalizer
    assert shown(result) == {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.PAUSED)}
    assert result.verdict is Verdict.PAUSED
    assert result.requeue_after == HELD_CAP
    assert result.for_generation is False
    assert world.cloud.calls == []
    assert world.kube.secret_writes == []


def protected_database(policy: str, pinned: bool = True) -> Resource:
    """A database with deletionProtection; pinned: its status records its cloud name, as
    every pass that may create writes it before the create."""
    body = {
        "kind": "DatabaseInstance",
        "metadata": {
            "namespace": NS,
            "name": NAME,
            "uid": "uid-orders",
            "generation": 2,
            "deletionTimestamp": "2030-01-01T00:00:00Z",
        },
        "spec": {
            "engine": "postgres",
            "instanceClass": "db.t3.micro",
            "deletionPolicy": policy,
            "deletionProtection": True,
        },
    }
    r = kinds.parse(body, region="us-east-1", cluster_id="test")
    return dataclasses.replace(r, status={"externalName": r.external_name}) if pinned else r


@pytest.mark.parametrize("policy", ["Delete", "Snapshot", "Retain"])
def test_deletion_protection_holds_the_deletion_whatever_the_policy(db_world, no_jitter, policy):
    world = db_world
    r = protected_database(policy)
    world.cloud.seed(r)
    calls_before = len(world.cloud.calls)
    result = world.delete(r, LATE)
    assert not result.release_finalizer and result.for_generation is False
    assert shown(result) == {
        cond.READY: (False, cond.DELETING),
        cond.SYNCED: (False, cond.DELETION_PROTECTED),
    }
    assert result.requeue_after == HELD_CAP
    synced = next(c for c in result.conditions if c.type == cond.SYNCED)
    assert '{"spec":{"deletionProtection":false}}' in synced.message
    assert f"deletionPolicy {policy}" in synced.message
    assert events(result) == [("Warning", cond.DELETION_PROTECTED)]
    # Not a call to the cloud, and the Secret stays.
    assert world.cloud.calls[calls_before:] == []
    assert r.external_name in world.cloud.objects and world.kube.secret_writes == []
    # Said once: a pass that finds the same condition posts no second Event.
    shown_before = dataclasses.replace(
        r, status={**r.status,
                   "conditions": [{"type": "Synced", "status": "False",
                                   "reason": cond.DELETION_PROTECTED, "message": synced.message}]}
    )  # fmt: skip
    assert events(world.delete(shown_before, LATE)) == []


def test_deletion_protection_holds_a_database_of_ours_whose_status_was_lost(db_world):
    """Unpinned (its status lost, say restored from a backup without it) but ours in the
    cloud: one look finds it, and it is held."""
    r = protected_database("Delete", pinned=False)
    db_world.cloud.seed(r)
    calls_before = len(db_world.cloud.calls)
    result = db_world.delete(r, LATE)
    assert not result.release_finalizer
    assert shown(result)[cond.SYNCED] == (False, cond.DELETION_PROTECTED)
    assert [c.method for c in db_world.cloud.calls[calls_before:]] == ["observe"]
    assert r.external_name in db_world.cloud.objects


@pytest.mark.parametrize("policy", ["Delete", "Snapshot", "Retain"])
def test_deletion_protection_holds_nothing_where_nothing_was_made(db_world, policy):
    """A protected database refused before any create (nothing of its name in the cloud)
    goes at once: there is nothing to protect, and its namespace is not held."""
    r = protected_database(policy, pinned=False)
    db_world.with_secret(r)
    result = db_world.delete(r, LATE)
    assert done(result)
    assert events(result) == [("Normal", "Retained" if policy == "Retain" else "Deleted")]
    assert db_world.cloud.objects == {}
    assert all(c.method == "observe" for c in db_world.cloud.calls)


def test_a_namespace_being_deleted_overrides_the_pause(world):
    r = resource(annotations=PAUSE)
    world.cloud.seed(r)
    world.terminating()
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Warning", "PauseOverridden"), ("Normal", "Deleted")]
    assert "deletionPolicy Delete" in result.events[0].message
    assert world.cloud.objects == {}


def test_a_namespace_being_deleted_still_honours_retain(world):
    r = resource("Retain", annotations=PAUSE)
    world.cloud.seed(r)
    world.terminating()
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Warning", "PauseOverridden"), ("Normal", "Retained")]
    assert r.external_name in world.cloud.objects


def test_another_owners_resource_is_left_untouched(world):
    r = resource()
    world.cloud.seed(r, owner="other")
    world.with_secret(r)
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Warning", "LeftUntouched")]
    assert "someone-else" not in result.events[0].message
    assert world.cloud.writes() == []
    assert r.external_name in world.cloud.objects
    assert world.kube.secrets == {}  # our own Secret goes all the same


def test_a_blocked_deletion_waits(world, no_jitter):
    r = resource()
    world.cloud.seed(r)
    world.with_secret(r)
    world.cloud.block_deletion = "The bucket you tried to delete is not empty"
    result = world.delete(r, LATE)
    assert not result.release_finalizer
    assert shown(result) == {cond.READY: (False, cond.DELETING)}
    assert result.conditions[0].message == "The bucket you tried to delete is not empty"
    assert result.verdict is Verdict.WAITING
    assert result.requeue_after == HELD_CAP
    assert (NS, SECRET) in world.kube.secrets


# -- placement ---------------------------------------------------------------------------


def test_a_resource_never_placed_has_nothing_in_the_cloud(world):
    r = resource(spec={"account": "team-b"})  # this operator serves no CloudAccounts
    world.with_secret(r)
    result = world.delete(r)
    assert done(result)
    assert world.cloud.calls == []
    assert world.kube.secrets == {}


def test_a_resource_that_lives_somewhere_it_may_not_act_is_refused(world):
    r = resource(spec={"account": "team-b"}, status={"account": "team-b"})
    with pytest.raises(AccountRefused):
        world.delete(r)
    assert world.cloud.calls == []


# -- access ------------------------------------------------------------------------------


def test_access_is_revoked_first(world):
    world.grants.access = Access(world.journal)
    r = resource(status={"access": [{"serviceAccount": "app", "level": "read"}]})
    world.cloud.seed(r)
    result = world.delete(r)
    assert done(result)
    assert events(result) == [("Normal", "AccessRevoked"), ("Normal", "Deleted")]
    revoke = world.journal.index(("access", "revoke_all", NAME))
    assert revoke < world.journal.index(("cloud", "delete", r.external_name))


def test_access_is_revoked_even_when_the_resource_is_retained(world):
    world.grants.access = Access(world.journal)
    r = resource("Retain", status={"access": [{"serviceAccount": "app", "level": "read"}]})
    world.cloud.seed(r)
    result = world.delete(r)
    assert events(result) == [("Normal", "AccessRevoked"), ("Normal", "Retained")]
    assert world.cloud.writes() == []


def test_nothing_is_revoked_that_status_does_not_hold(world):
    world.grants.access = Access(world.journal)
    r = resource()
    result = world.delete(r)
    assert events(result) == [("Normal", "Deleted")]
    assert ("access", "revoke_all", NAME) not in world.journal
