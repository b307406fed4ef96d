"""Stage secret: the connection Secret, written only when its content differs; a database's
master password set in the cloud first, then the Secret; never another owner's Secret."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import Observation
from provisioner.model import annotations as annotation_keys
from provisioner.model import connection_secret
from provisioner.model.resource import Resource
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import EVERYTHING_REQUESTED
from provisioner.reconciler.secret import ConnectionSecret
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeCloud, FakeKube, FakePasswordCloud, Journal

NS, NAME = "team-a", "orders"
SECRET = f"{NAME}-connection"
SEEDED = "Seeded0Password0Value0000000000A"
DB_SPEC = {"engine": "postgres", "instanceClass": "db.t3.micro"}


class World:
    def __init__(self) -> None:
        self.journal: Journal = []
        self.kube = FakeKube(self.journal)
        self.queue = FakeCloud("Queue", journal=self.journal)
        self.db = FakePasswordCloud("DatabaseInstance", journal=self.journal)
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        self.secret = ConnectionSecret(self.kube, self.workers, self.states)  # type: ignore[arg-type]

    def cloud(self, r: Resource) -> FakeCloud:
        return self.db if r.kind == "DatabaseInstance" else self.queue

    def write(self, r: Resource) -> Progress:
        """One Secret write as a pass makes it, after observing the cloud."""
        cloud = self.cloud(r)
        obs: Observation = cloud.observe(r)
        p = Progress(r, kinds.descriptor(r.kind), 0, EVERYTHING_REQUESTED)
        asyncio.run(self.secret.write(p, cloud, obs))
        return p

    def stored(self) -> dict[str, Any] | None:
        return self.kube.secrets.get((NS, SECRET))

    def data(self) -> dict[str, str]:
        found = self.stored()
        assert found is not None
        return connection_secret.decode(found)


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
            "name": NAME,
            "uid": "uid-orders",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": {**(DB_SPEC if kind == "DatabaseInstance" else {}), **(spec or {})},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def events(p: Progress) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in p.events]


def seed_secret(world: World, r: Resource, data: dict[str, str], password: str | None) -> None:
    world.kube.put_secret(NS, connection_secret.build(r, data, password))


# -- a kind without a password -----------------------------------------------------------


def test_the_first_write_creates_the_secret_quietly(world):
    r = resource()
    world.queue.seed(r)
    p = world.write(r)
    assert world.kube.secret_writes == [("create", SECRET)]
    obj = world.queue.objects[r.external_name]
    assert world.data() == world.queue.connection(r.external_name, obj)
    assert p.fields == {"connectionSecret": SECRET}
    assert p.events == []  # its creation is part of Ready, not news of its own
    stored = world.stored()
    assert stored is not None and connection_secret.owned_by(stored, r)


def test_the_same_content_is_not_written_again(world):
    r = resource()
    world.queue.seed(r)
    world.write(r)
    p = world.write(r)
    assert world.kube.secret_writes == [("create", SECRET)]
    assert p.events == [] and p.fields == {"connectionSecret": SECRET}


def test_an_edited_secret_is_restored(world):
    r = resource()
    world.queue.seed(r)
    world.write(r)
    stored = world.stored()
    assert stored is not None
    stored["data"]["host"] = base64.b64encode(b"edited.example").decode()
    p = world.write(r)
    assert world.kube.secret_writes == [("create", SECRET), ("replace", SECRET)]
    assert world.data()["host"] != "edited.example"
    assert events(p) == [("Normal", "SecretWritten")]


def test_a_deleted_secret_is_restored_with_an_event(world):
    r = resource(status={"connectionSecret": SECRET})
    world.queue.seed(r)
    p = world.write(r)
    assert world.kube.secret_writes == [("create", SECRET)]
    assert events(p) == [("Normal", "SecretWritten")]


def test_another_owners_secret_is_never_touched(world):
    r = resource()
    world.queue.seed(r)
    foreign = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NS, "labels": {"app": "someone-else"}},
        "data": {"token": base64.b64encode(b"not-ours").decode()},
    }
    world.kube.put_secret(NS, foreign)
    with pytest.raises(connection_secret.SecretConflict):
        world.write(r)
    assert world.kube.secret_writes == []
    assert world.data() == {"token": "not-ours"}


def test_a_template_naming_an_unknown_value_is_refused(world):
    r = resource(spec={"connectionSecret": {"keys": {"url": "{{ .nope }}"}}})
    world.queue.seed(r)
    with pytest.raises(errors.NotSupportedError, match="nope"):
        world.write(r)
    assert world.kube.secret_writes == []


def test_templates_shape_the_data(world):
    r = resource(spec={"connectionSecret": {"keys": {"url": "sqs://{{ .host }}"}}})
    world.queue.seed(r)
    world.write(r)
    assert world.data() == {"url": f"sqs://{r.external_name}.example.internal"}


# -- a database's password -------------------------------------------------------------------


def test_the_password_a_database_was_created_with_goes_to_its_secret(world):
    r = resource("DatabaseInstance")
    pending = "Pending0Password0Value000000000A"
    world.db.seed(r, password=pending)
    world.states.of(r.uid).pending_password = pending
    p = world.write(r)
    assert world.db.writes() == []  # no new password
    assert world.data()["password"] == pending
    assert world.states.of(r.uid).pending_password is None
    assert p.events == []


def test_the_stored_password_is_kept(world):
    r = resource("DatabaseInstance")
    obj = world.db.seed(r, password=SEEDED)
    data = world.db.with_password(world.db.connection(r.external_name, obj), SEEDED)
    seed_secret(world, r, data, SEEDED)
    p = world.write(r)
    assert world.db.writes() == []
    assert world.kube.secret_writes == []
    assert p.events == []


def test_a_password_nobody_knows_is_reset_cloud_first(world):
    r = resource("DatabaseInstance")
    world.db.seed(r, password=SEEDED)
    p = world.write(r)
    assert world.db.writes() == ["set_password"]
    new = world.db.objects[r.external_name].password
    assert new != SEEDED
    assert world.data()["password"] == new
    assert world.journal.index(("cloud", "set_password", r.external_name)) < world.journal.index(
        ("kube", "create_secret", SECRET)
    )
    assert events(p) == [("Normal", "PasswordChanged")]
    assert p.events[0].message == "master password reset: the Secret had none"


def test_a_rotation_sets_a_new_password_and_records_the_request(world):
    r = resource("DatabaseInstance", annotations={annotation_keys.ROTATE_PASSWORD_AT: "r1"})
    obj = world.db.seed(r, password=SEEDED)
    data = world.db.with_password(world.db.connection(r.external_name, obj), SEEDED)
    seed_secret(world, r, data, SEEDED)
    p = world.write(r)
    assert world.db.writes() == ["set_password"]
    new = world.db.objects[r.external_name].password
    assert new != SEEDED and world.data()["password"] == new
    assert world.kube.secret_writes == [("replace", SECRET)]
    assert events(p) == [("Normal", "PasswordChanged"), ("Normal", "SecretWritten")]
    assert p.events[0].message == "master password rotated on request"
    assert p.fields["lastPasswordRotation"] == "r1"


def test_no_password_is_set_for_a_secret_that_is_not_ours(world):
    r = resource("DatabaseInstance", annotations={annotation_keys.ROTATE_PASSWORD_AT: "r1"})
    world.db.seed(r, password=SEEDED)
    world.kube.put_secret(
        NS, {"metadata": {"name": SECRET, "namespace": NS}, "data": {"x": "eA=="}}
    )
    with pytest.raises(connection_secret.SecretConflict):
        world.write(r)
    assert world.db.writes() == []


def test_no_password_shows_in_events_or_status_fields(world):
    r = resource("DatabaseInstance", annotations={annotation_keys.ROTATE_PASSWORD_AT: "r1"})
    world.db.seed(r, password=SEEDED)
    p = world.write(r)
    shown = json.dumps([[e.message for e in p.events], p.fields])
    assert world.db.passwords
    for password in world.db.passwords:
        assert password not in shown


# -- delete ------------------------------------------------------------------------------


def test_delete_removes_our_own_secret(world):
    r = resource()
    world.queue.seed(r)
    world.write(r)
    asyncio.run(world.secret.delete(r))
    assert world.stored() is None
    assert world.kube.secret_writes[-1] == ("delete", SECRET)


def test_delete_leaves_another_owners_secret(world):
    r = resource()
    world.kube.put_secret(NS, {"metadata": {"name": SECRET, "namespace": NS}, "data": {}})
    asyncio.run(world.secret.delete(r))
    assert world.stored() is not None
    assert world.kube.secret_writes == []


def test_delete_of_a_name_no_secret_can_have_calls_nothing(world):
    r = resource(spec={"connectionSecret": {"name": "Not_A_Valid/Name"}})
    asyncio.run(world.secret.delete(r))
    assert world.journal == []


# -- a read replica: the source's credentials ----------------------------------------------


def source_database(world: World, password: str | None) -> None:
    """The replica's source, `primary`, with its connection Secret (holding `password`)."""
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "DatabaseInstance",
        "metadata": {"namespace": NS, "name": "primary", "uid": "uid-primary", "generation": 1},
        "spec": dict(DB_SPEC),
    }
    world.kube.resources[("DatabaseInstance", NS, "primary")] = body
    if password is not None:
        source = kinds.parse(body, region="us-east-1", cluster_id="test")
        data = {"host": "primary.example", "port": "5432", "username": "app"}
        world.kube.put_secret(
            NS, connection_secret.build(source, {**data, "password": password}, password)
        )


def test_a_replicas_secret_carries_its_sources_password_and_sets_none(world):
    source_database(world, SEEDED)
    r = resource("DatabaseInstance", {"replicaOf": {"name": "primary"}})
    world.db.seed(r)
    p = world.write(r)
    data = world.data()
    assert data["password"] == SEEDED
    assert data["host"] != "primary.example"  # the replica's own host
    assert [c.method for c in world.db.calls if c.method == "set_password"] == []
    assert p.events == []


def test_a_replica_waits_for_its_sources_secret(world):
    source_database(world, None)
    r = resource("DatabaseInstance", {"replicaOf": {"name": "primary"}})
    world.db.seed(r)
    with pytest.raises(errors.RetryableError, match="source DatabaseInstance primary"):
        world.write(r)
    assert world.stored() is None
    assert [c.method for c in world.db.calls if c.method == "set_password"] == []


def test_a_rotation_asked_of_a_replica_is_answered_and_sets_nothing(world):
    source_database(world, SEEDED)
    asked = {annotation_keys.ROTATE_PASSWORD_AT: "r1"}
    r = resource("DatabaseInstance", {"replicaOf": {"name": "primary"}}, annotations=asked)
    world.db.seed(r)
    p = world.write(r)
    assert world.data()["password"] == SEEDED
    assert [c.method for c in world.db.calls if c.method == "set_password"] == []
    assert events(p) == [("Warning", "RotationIgnored")]
    assert p.fields["lastPasswordRotation"] == "r1"
