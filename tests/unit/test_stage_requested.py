"""Stage requested: which spec fields the user changed since the spec last handled (applied
in every case), as opposed to drift; and the changes a plan listed, which count as asked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioner.kinds import registry as kinds
from provisioner.model import annotations as annotation_keys
from provisioner.model.resource import Resource
from provisioner.reconciler.requested import (
    EVERYTHING_REQUESTED,
    NOTHING_REQUESTED,
    Requested,
    last_handled_spec,
    planned,
    requested_fields,
)


def resource(status: dict[str, Any] | None = None, plan_only: bool = False) -> Resource:
    annotations = {annotation_keys.PLAN_ONLY: "true"} if plan_only else {}
    body = {
        "kind": "Queue",
        "metadata": {
            "namespace": "ns",
            "name": "q",
            "uid": "uid-q",
            "generation": 2,
            "annotations": annotations,
        },
        "spec": {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def with_kopf(stored: Any) -> dict[str, Any]:
    return {"status": {"kopf": {"lastHandledConfiguration": stored}}}


# -- covers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("diff_field", "covered"),
    [
        ("spec.visibilityTimeoutSeconds", True),
        # A nested field counts by its top-level spec path.
        ("spec.lifecycle.expireAfterDays", True),
        ("spec.lifecycle", True),
        # The tags' FieldDiff is named "tags"; the spec path is spec.tags.
        ("tags", True),
        ("spec.tags", True),
        ("spec.delaySeconds", False),
        ("spec.lifecycleRules", False),  # a prefix of a name is not that name
        ("spec.versioning.enabled", False),
    ],
)
def test_covers_by_top_level_path(diff_field, covered):
    asked = Requested(frozenset({"spec.visibilityTimeoutSeconds", "spec.lifecycle", "spec.tags"}))
    assert asked.covers(diff_field) is covered


def test_everything_and_nothing():
    for f in ("spec.a", "spec.a.b", "tags", "x"):
        assert EVERYTHING_REQUESTED.covers(f)
        assert not NOTHING_REQUESTED.covers(f)


def test_tags_not_asked_are_drift():
    assert not Requested(frozenset({"spec.delaySeconds"})).covers("tags")


# -- last_handled_spec -------------------------------------------------------------------


def test_last_handled_spec_reads_kopfs_record():
    stored = json.dumps({"spec": {"delaySeconds": 5}, "metadata": {"labels": {}}})
    assert last_handled_spec(with_kopf(stored)) == {"delaySeconds": 5}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"status": None},
        {"status": {}},
        {"status": {"kopf": None}},
        {"status": {"kopf": {}}},
        with_kopf(""),
        with_kopf(None),
    ],
)
def test_no_record_is_none(body):
    assert last_handled_spec(body) is None


@pytest.mark.parametrize(
    "stored",
    [
        "{not json",
        "[1, 2]",  # JSON, but no object
        '"spec"',
        "null",
        "42",
    ],
)
def test_bad_json_is_none(stored):
    assert last_handled_spec(with_kopf(stored)) is None


@pytest.mark.parametrize("stored", ['{"spec": null}', "{}", '{"spec": {}}'])
def test_a_record_without_a_spec_is_an_empty_spec(stored):
    assert last_handled_spec(with_kopf(stored)) == {}


@pytest.mark.parametrize(
    "stored",
    [
        '{"spec": 5}',
        {"spec": {"delaySeconds": 5}},  # an object where kopf keeps a JSON string
    ],
    ids=["spec-not-an-object", "record-not-a-string"],
)
def test_a_record_of_the_wrong_shape_is_none(stored):
    """status.kopf can be edited by whoever may write status: whatever it holds, the pass
    goes on as if nothing was recorded (every field requested), never fails."""
    assert last_handled_spec(with_kopf(stored)) is None


def test_the_result_is_a_copy():
    body = with_kopf(json.dumps({"spec": {"a": 1}}))
    first = last_handled_spec(body)
    assert first is not None
    first["a"] = 2
    assert last_handled_spec(body) == {"a": 1}


# -- requested_fields ----------------------------------------------------------------------


def test_a_new_resource_requests_everything():
    assert requested_fields(None, {"delaySeconds": 5}) is EVERYTHING_REQUESTED


def test_an_unchanged_spec_requests_nothing():
    spec = {"delaySeconds": 5, "tags": {"a": "b"}}
    assert requested_fields(dict(spec), spec) == NOTHING_REQUESTED


def test_changed_added_and_removed_fields_are_requested():
    last = {"delaySeconds": 5, "fifo": False, "tags": {"a": "b"}, "gone": 1}
    current = {"delaySeconds": 6, "fifo": False, "tags": {"a": "c"}, "new": 2}
    asked = requested_fields(last, current)
    assert asked.paths == frozenset({"spec.delaySeconds", "spec.tags", "spec.gone", "spec.new"})
    assert not asked.everything
    assert asked.covers("tags") and not asked.covers("spec.fifo")


def test_a_nested_change_requests_its_top_level_field():
    last = {"lifecycle": {"expireAfterDays": 7, "prefix": "a"}}
    current = {"lifecycle": {"expireAfterDays": 8, "prefix": "a"}}
    asked = requested_fields(last, current)
    assert asked.paths == frozenset({"spec.lifecycle"})
    assert asked.covers("spec.lifecycle.prefix")


def test_an_empty_last_spec_is_not_a_new_resource():
    asked = requested_fields({}, {"delaySeconds": 5})
    assert asked.paths == frozenset({"spec.delaySeconds"}) and not asked.everything


# -- planned -------------------------------------------------------------------------------

PLAN = {
    "action": "Update",
    "changes": [
        {"field": "spec.lifecycle.expireAfterDays", "cloud": "7", "spec": "8"},
        {"field": "tags", "cloud": "{}", "spec": "{}"},
        {"field": "", "cloud": "", "spec": ""},
        {"cloud": "x"},
    ],
}


def test_the_changes_a_plan_listed_count_as_requested():
    asked = planned(resource({"plan": PLAN}), Requested(frozenset({"spec.delaySeconds"})))
    assert asked.paths == frozenset({"spec.delaySeconds", "spec.lifecycle", "spec.tags"})
    assert not asked.everything


def test_without_a_plan_nothing_is_added():
    asked = Requested(frozenset({"spec.delaySeconds"}))
    assert planned(resource(), asked) is asked
    assert planned(resource({"plan": None}), asked) is asked
    assert planned(resource({"plan": {"action": "None", "changes": []}}), asked) is asked


def test_a_plan_still_planning_adds_nothing():
    asked = NOTHING_REQUESTED
    assert planned(resource({"plan": PLAN}, plan_only=True), asked) is asked


def test_everything_stays_everything():
    assert planned(resource({"plan": PLAN}), EVERYTHING_REQUESTED) is EVERYTHING_REQUESTED
