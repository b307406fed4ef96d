"""Stage converge: create the cloud resource (safe to repeat after a crash), write the
requested changes, and correct drift or only report it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ADOPTABLE_BY_TAG, FieldDiff, Observation
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.converge import Converge
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.ownership import create_token
from provisioner.reconciler.placement import Placement
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import (
    EVERYTHING_REQUESTED,
    NOTHING_REQUESTED,
    Requested,
)
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeCloud, FakeKube, FakePasswordCloud, Journal

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
NS = "team-a"
VIS = "spec.visibilityTimeoutSeconds"
DELAY = "spec.delaySeconds"
REPORT = {annotation_keys.DRIFT_POLICY: "report"}


class World:
    def __init__(self) -> None:
        self.journal: Journal = []
        self.kube = FakeKube(self.journal)
        self.clouds: dict[str, FakeCloud] = {
            "Queue": FakeCloud("Queue", journal=self.journal),
            "S3Bucket": FakeCloud("S3Bucket", tags_on_create=False, journal=self.journal),
            "DatabaseInstance": FakePasswordCloud("DatabaseInstance", journal=self.journal),
        }
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        self.observer = Observer(self.clouds, self.workers, self.states)
        placement = Placement(SETTINGS, None, None, self.workers, self.states)
        self.converge = Converge(
            self.kube,  # type: ignore[arg-type]
            self.workers,
            self.observer,
            placement,
            self.states,
        )

    def create(self, p: Progress) -> Observation:
        return asyncio.run(self.converge.create(p, self.clouds[p.resource.kind]))

    def apply(self, p: Progress, obs: Observation) -> Observation:
        client = self.clouds[p.resource.kind]
        return asyncio.run(self.converge.apply_changes(p, client, obs))

    def observe(self, resource: Resource) -> Observation:
        return asyncio.run(self.observer.observe_plainly(resource))


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


def resource(
    kind: str = "Queue",
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
) -> Resource:
    body = {
        "kind": kind,
        "metadata": {
            "namespace": NS,
            "name": "orders",
            "uid": "uid-orders",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": spec or {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def progress(
    r: Resource, requested: Requested = EVERYTHING_REQUESTED, resync: bool = False
) -> Progress:
    return Progress(r, kinds.descriptor(r.kind), 0, requested, resync)


def events(p: Progress) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in p.events]


def conditions(p: Progress) -> list[tuple[str, bool, str]]:
    return [(c.type, c.status, c.reason) for c in p.conditions]


# -- create ------------------------------------------------------------------------------


def test_create_makes_it_and_observes_it(world):
    r = resource()
    p = progress(r)
    obs = world.create(p)
    cloud = world.clouds["Queue"]
    assert cloud.writes() == ["create"]
    assert obs.exists and obs.owned_by(r)
    assert events(p) == [("Normal", "Created")]
    assert r.external_name in p.events[0].message
    # A kind that tags in its create call and a cluster without CloudAccounts: no status
    # write before the call.
    assert world.kube.status_patches == []


def test_create_uses_the_clients_own_answer(world):
    cloud = world.clouds["Queue"]
    cloud.answers_create = True
    world.create(progress(resource()))
    assert [c.method for c in cloud.calls] == ["create"]  # nothing read again


def test_a_resource_gone_from_the_cloud_is_recreated_with_a_warning(world):
    p = progress(resource(), NOTHING_REQUESTED, resync=True)
    world.create(p)
    assert events(p) == [("Warning", "Vanished"), ("Normal", "Created")]


def test_a_kind_that_tags_after_creating_records_its_name_first(world):
    r = resource("S3Bucket")
    p = progress(r)
    world.create(p)
    patch = ("kube", "patch_status", "orders")
    create = ("cloud", "create", r.external_name)
    assert world.journal.index(patch) < world.journal.index(create)
    token = create_token(r)
    assert world.kube.status_patches == [
        ("S3Bucket", "orders", {"externalName": r.external_name, "createToken": token})
    ]
    # The resource the pass goes on with knows it too.
    assert r.status["createToken"] == token
    # A repeat (the create token already recorded) writes nothing more before its call.
    world.clouds["S3Bucket"].objects.clear()
    world.create(progress(r))
    assert len(world.kube.status_patches) == 1


def test_a_first_create_found_by_a_look_is_no_vanished_resource(world):
    """No create of that name was ever recorded: the look finds one never made (a pass
    that failed before its create), not one that disappeared."""
    p = progress(resource("S3Bucket"), NOTHING_REQUESTED, resync=True)
    world.create(p)
    assert events(p) == [("Normal", "Created")]
    # Once recorded, its absence is news.
    world.clouds["S3Bucket"].objects.clear()
    again = progress(p.resource, NOTHING_REQUESTED, resync=True)
    world.create(again)
    assert events(again) == [("Warning", "Vanished"), ("Normal", "Created")]


def test_a_database_is_created_with_a_password_kept_until_its_secret(world):
    r = resource("DatabaseInstance", {"engine": "postgres", "instanceClass": "db.t3.micro"})
    cloud = world.clouds["DatabaseInstance"]
    assert isinstance(cloud, FakePasswordCloud)
    cloud.script.fail("create", errors.RetryableError("Throttling", "Throttling"))
    with pytest.raises(errors.RetryableError):
        world.create(progress(r))
    pending = world.states.of(r.uid).pending_password
    assert pending
    world.create(progress(r))
    # The retry hands over the same password: the one the Secret will hold.
    assert world.states.of(r.uid).pending_password == pending
    assert [c.secrets for c in cloud.calls if c.method == "create"] == [
        ("password",),
        ("password",),
    ]
    assert cloud.objects[r.external_name].password == pending


def test_a_lost_answer_to_our_own_create_is_no_conflict(world):
    r = resource()
    cloud = world.clouds["Queue"]
    cloud.lose_create_answer = True
    with pytest.raises(errors.RetryableError):
        world.create(progress(r))
    p = progress(r)
    obs = world.create(p)  # "already exists", and tagged as ours
    assert obs.exists and obs.owned_by(r)
    assert events(p) == [("Normal", "Created")]


def test_a_name_taken_by_someone_else_is_a_conflict(world):
    r = resource()
    world.clouds["Queue"].seed(r, owner="other")
    p = progress(r)
    with pytest.raises(errors.ConflictError):
        world.create(p)
    assert p.events == []


# -- apply_changes -----------------------------------------------------------------------


def seeded(world: World, r: Resource, **fields: Any) -> Observation:
    world.clouds[r.kind].seed(r, fields=fields)
    return world.observe(r)


def test_requested_changes_are_written_and_said(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60})
    obs = seeded(world, r, **{VIS: 30})
    p = progress(r, Requested(frozenset({VIS})))
    after = world.apply(p, obs)
    cloud = world.clouds["Queue"]
    assert cloud.writes() == ["update"]
    assert cloud.calls[-2].fields == {VIS: 60}
    assert after.diffs == []
    assert events(p) == [("Normal", "Updated")]
    assert VIS in p.events[0].message
    assert p.conditions == []  # no drift


def test_drift_is_corrected_by_default(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60})
    obs = seeded(world, r, **{VIS: 60, DELAY: 9})
    p = progress(r, Requested(frozenset({VIS})))
    world.apply(p, obs)
    assert world.clouds["Queue"].calls[-2].fields == {DELAY: 0}
    assert conditions(p) == [(cond.DRIFTED, False, cond.DRIFT_CORRECTED)]
    assert events(p) == [("Warning", "Drifted")]  # no Updated: nobody asked
    assert p.events[0].message.startswith("corrected: ")
    assert "9 -> 0" in p.events[0].message


def test_changes_and_drift_are_written_in_one_call(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60})
    obs = seeded(world, r, **{VIS: 30, DELAY: 9})
    p = progress(r, Requested(frozenset({VIS})))
    world.apply(p, obs)
    cloud = world.clouds["Queue"]
    assert cloud.writes() == ["update"]
    assert cloud.calls[-2].fields == {VIS: 60, DELAY: 0}
    assert events(p) == [("Warning", "Drifted"), ("Normal", "Updated")]
    assert "spec.delaySeconds" not in p.events[1].message


def test_report_only_drift_is_left_in_place(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60}, annotations=REPORT)
    obs = seeded(world, r, **{VIS: 30, DELAY: 9})
    p = progress(r, Requested(frozenset({VIS})))
    after = world.apply(p, obs)
    cloud = world.clouds["Queue"]
    assert cloud.calls[-2].fields == {VIS: 60}  # the requested change only
    assert after.diffs == [FieldDiff(DELAY, 9, 0)]
    assert conditions(p) == [(cond.DRIFTED, True, cond.DRIFT_REPORTED)]
    assert events(p) == [("Warning", "Drifted"), ("Normal", "Updated")]
    assert p.events[0].message.startswith("not corrected (report only): ")


def test_report_only_drift_already_reported_is_not_said_again(world):
    r0 = resource(annotations=REPORT)
    obs = seeded(world, r0, **{DELAY: 9})
    message = FieldDiff(DELAY, 9, 0).describe()
    shown = {
        "conditions": [
            {
                "type": cond.DRIFTED,
                "status": "True",
                "reason": cond.DRIFT_REPORTED,
                "message": message,
            }
        ]
    }
    r = resource(annotations=REPORT, status=shown)
    p = progress(r, NOTHING_REQUESTED)
    assert world.apply(p, obs) is obs  # nothing to write: nothing read again
    assert world.clouds["Queue"].writes() == []
    assert conditions(p) == [(cond.DRIFTED, True, cond.DRIFT_REPORTED)]
    assert p.events == []


def test_drift_gone_clears_drifted(world):
    shown = {"conditions": [{"type": cond.DRIFTED, "status": "True", "reason": "DriftReported"}]}
    r = resource(spec={"visibilityTimeoutSeconds": 60}, status=shown)
    obs = seeded(world, r, **{VIS: 30})
    p = progress(r, Requested(frozenset({VIS})))
    world.apply(p, obs)
    assert conditions(p) == [(cond.DRIFTED, False, cond.NO_DRIFT)]


def test_a_write_to_a_kind_whose_reads_lag_is_remembered(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60})
    obs = seeded(world, r, **{VIS: 30})
    world.clouds["Queue"].hold_updates = True  # the read after the write shows the old value
    p = progress(r, Requested(frozenset({VIS})))
    after = world.apply(p, obs)
    assert kinds.descriptor("Queue").settle_seconds > 0
    assert after.diffs == [] and after.settling == [VIS]


def test_a_write_to_a_kind_whose_reads_do_not_lag_is_not_remembered(world):
    r = resource("S3Bucket", {"versioning": True})
    obs = seeded(world, r, **{"spec.versioning": False})
    world.clouds["S3Bucket"].hold_updates = True
    p = progress(r, EVERYTHING_REQUESTED)
    after = world.apply(p, obs)
    assert [d.field for d in after.diffs] == ["spec.versioning"]
    assert world.states.of(r.uid).recent_writes is None


RECORD = [{"targetArn": "arn:aws:sqs:us-east-1:000000000000:inbox", "statementId": "sid"}]


def test_what_an_update_makes_beyond_the_resource_is_recorded_before_it(world):
    r = resource("S3Bucket", {"versioning": True})
    obs = seeded(world, r, **{"spec.versioning": False})
    obs.status = {"notifications": RECORD}  # what the bucket's update is about to make
    world.apply(progress(r), obs)
    patch = ("kube", "patch_status", "orders")
    update = ("cloud", "update", r.external_name)
    assert world.journal.index(patch) < world.journal.index(update)
    assert world.kube.status_patches == [("S3Bucket", "orders", {"notifications": RECORD})]
    assert r.status["notifications"] == RECORD


def test_a_record_status_already_holds_is_not_written_again(world):
    r = resource("S3Bucket", {"versioning": True}, status={"notifications": RECORD})
    obs = seeded(world, r, **{"spec.versioning": False})
    obs.status = {"notifications": RECORD}
    world.apply(progress(r), obs)
    assert world.clouds["S3Bucket"].writes() == ["update"]
    assert world.kube.status_patches == []


def test_a_kind_that_records_nothing_writes_no_status_before_an_update(world):
    r = resource(spec={"visibilityTimeoutSeconds": 60})
    obs = seeded(world, r, **{VIS: 30})
    obs.status = {"notifications": RECORD}  # not a field the Queue kind records
    world.apply(progress(r), obs)
    assert world.clouds["Queue"].writes() == ["update"]
    assert world.kube.status_patches == []


def test_adopting_takes_the_spec_for_every_field_and_is_no_drift(world):
    r = resource(
        spec={"queueName": "legacy-orders", "visibilityTimeoutSeconds": 60},
        annotations={annotation_keys.ADOPT: "true"},
    )
    world.clouds["Queue"].seed(
        r, owner="none", fields={VIS: 30}, tags={ADOPTABLE_BY_TAG: NS, "team": "x"}
    )
    obs = world.observe(r)
    p = progress(r, NOTHING_REQUESTED)
    after = world.apply(p, obs)
    assert after.owned_by(r)
    assert events(p) == [("Normal", "Adopted"), ("Normal", "Updated")]
    assert conditions(p) == []  # nothing of it is drift
    written = world.clouds["Queue"].calls[-2].fields
    assert set(written) == {VIS, "tags"}


def test_nothing_to_write_reads_nothing_again(world):
    r = resource()
    obs = seeded(world, r)
    p = progress(r, EVERYTHING_REQUESTED)
    calls = len(world.clouds["Queue"].calls)
    assert world.apply(p, obs) is obs
    assert len(world.clouds["Queue"].calls) == calls
    assert p.events == [] and p.conditions == []


def test_a_database_made_without_the_password_leaves_none_pending(world, monkeypatch):
    """A restore or a replica carries another's password: the client takes the generated one
    out, and the Secret stage must then set a new one in the cloud (nothing is pending)."""
    r = resource("DatabaseInstance", {"engine": "postgres", "instanceClass": "db.t3.micro"})
    cloud = world.clouds["DatabaseInstance"]
    made = FakeCloud.create

    def restore(self, resource, secrets):
        secrets.pop("password")
        return made(self, resource, {})

    monkeypatch.setattr(FakePasswordCloud, "create", restore)
    world.create(progress(r))
    assert cloud.objects[r.external_name].password in (None, "")
    assert world.states.of(r.uid).pending_password is None
