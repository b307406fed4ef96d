"""DatabaseInstance restore and replica sources: parsing, the snapshot rule, what status shows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from provisioner.kinds import rds_sources
from provisioner.kinds.registry import parse
from provisioner.model.resource import Resource

BASE = {"engine": "postgres", "instanceClass": "db.t3.micro"}
SOURCE = "team-a-primary-1234abcd"


def db(namespace: str = "team-a", **spec: Any) -> Resource:
    body = {
        "kind": "DatabaseInstance",
        "metadata": {"namespace": namespace, "name": "orders", "uid": "u-1", "generation": 1},
        "spec": {**BASE, **spec},
    }
    return parse(body, region="us-east-1", cluster_id="prod")


def instance(tags: dict[str, str], source: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"TagList": [{"Key": k, "Value": v} for k, v in tags.items()]}
    if source:
        found["ReadReplicaSourceDBInstanceIdentifier"] = source
    return found


@pytest.mark.parametrize(
    ("restore", "described", "keys"),
    [
        ({"snapshotIdentifier": "s1"}, "snapshot s1", []),
        (
            {"finalSnapshotOf": {"name": "old"}},
            "the newest final snapshot of DatabaseInstance old",
            [],
        ),
        (
            {"pointInTime": {"sourceRef": {"name": "live"}, "time": "2026-01-02T03:04:05Z"}},
            "DatabaseInstance live at 2026-01-02T03:04:05Z",
            [rds_sources.RESTORE_SOURCE],
        ),
        (
            {"pointInTime": {"sourceRef": {"name": "live"}, "latest": True}},
            "DatabaseInstance live at its latest restorable time",
            [rds_sources.RESTORE_SOURCE],
        ),
    ],
)
def test_each_restore_source_is_parsed_planned_and_depended_on(restore, described, keys):
    r = db(restoreFrom=restore)
    assert r.spec.restore_from.describe() == described
    assert rds_sources.planned_create(r) == f", restored from {described}"
    assert [d.key for d in r.dependencies] == keys
    assert all(d.until_created and not d.credentials for d in r.dependencies)


def test_a_replica_depends_on_its_source_for_good_and_takes_its_credentials():
    r = db(replicaOf={"name": "primary"})
    assert r.spec.replica_of == "primary" and r.spec.restore_from is None
    [dependency] = r.dependencies
    assert (dependency.key, dependency.name, dependency.kind) == (
        rds_sources.REPLICA_SOURCE,
        "primary",
        "DatabaseInstance",
    )
    assert dependency.credentials and not dependency.until_created
    assert rds_sources.planned_create(r) == ", a read replica of DatabaseInstance primary"


def test_a_plain_database_has_no_source():
    r = db()
    assert r.spec.restore_from is None and r.spec.replica_of == ""
    assert r.dependencies == () and rds_sources.planned_create(r) == ""


OURS = {
    "provisioner.dev/namespace": "team-a",
    "provisioner.dev/cluster": "prod",
    "provisioner.dev/name": "orders",
}


@pytest.mark.parametrize(
    ("tags", "allowed"),
    [
        (OURS, True),
        ({}, False),  # untagged
        ({**OURS, "provisioner.dev/namespace": "team-b"}, False),  # another namespace's
        ({**OURS, "provisioner.dev/cluster": "staging"}, False),  # another cluster's
        ({"provisioner.dev/adoptable-by": "team-a"}, True),  # offered to this namespace
        ({"provisioner.dev/adoptable-by": "team-b"}, False),  # offered to another
    ],
)
def test_only_the_namespaces_own_or_offered_snapshots_may_be_restored(tags, allowed):
    assert rds_sources.belongs(tags, db()) is allowed


@pytest.mark.parametrize(
    ("tag", "shown"),
    [
        ("snapshot=s1", {"snapshotIdentifier": "s1"}),
        (
            "finalSnapshotOf=old snapshot=old-1-final-99",
            {"finalSnapshotOf": "old", "snapshotIdentifier": "old-1-final-99"},
        ),
        (
            "sourceRef=live instance=team-a-live-1 time=2026-01-02T03:04:05Z",
            {
                "pointInTimeOf": "live",
                "sourceInstanceIdentifier": "team-a-live-1",
                "time": "2026-01-02T03:04:05Z",
            },
        ),
    ],
)
def test_status_shows_what_the_restore_recorded(tag, shown):
    status = rds_sources.status(db(), instance({rds_sources.RESTORED_FROM_TAG: tag}))
    assert status == {"restoredFrom": shown}


def test_status_of_an_instance_made_empty_has_neither_field_and_removes_them():
    assert rds_sources.status(db(), instance(OURS)) == {}
    was_replica = dataclasses.replace(db(), status={"replicaOf": SOURCE})
    assert rds_sources.status(was_replica, instance(OURS)) == {"replicaOf": None}


def test_a_replica_is_one_the_operator_made_and_has_not_promoted():
    made = instance({rds_sources.REPLICA_OF_TAG: SOURCE}, source=SOURCE)
    assert rds_sources.is_replica(made)
    assert rds_sources.status(db(), made)["replicaOf"] == SOURCE
    # moto keeps naming the source after a promotion; the tag goes with it.
    assert not rds_sources.is_replica(instance({}, source=SOURCE))
    assert not rds_sources.is_replica(instance({rds_sources.REPLICA_OF_TAG: SOURCE}))


def test_removing_replica_of_is_a_promotion_to_make():
    replica = instance({rds_sources.REPLICA_OF_TAG: SOURCE}, source=SOURCE)
    [diff] = rds_sources.diffs(db(), replica)
    assert (diff.field, diff.observed, diff.desired) == ("spec.replicaOf", SOURCE, None)
    assert rds_sources.diffs(db(replicaOf={"name": "primary"}), replica) == []
    assert rds_sources.diffs(db(), instance({})) == []


def test_the_operators_own_record_tags_are_kept_not_drift():
    tags = {rds_sources.RESTORED_FROM_TAG: "snapshot=s1", rds_sources.REPLICA_OF_TAG: SOURCE}
    found = instance({**tags, "team": "x"})
    assert rds_sources.kept_tags(found) == tags
