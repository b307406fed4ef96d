"""provisioner.model.conditions: merge, status_patch (nothing written if unchanged), changed."""

from __future__ import annotations

import copy
import random

import pytest

from provisioner.model import conditions as cond
from provisioner.model.conditions import Condition

OLD = "2024-01-01T00:00:00Z"
NEW = "2030-06-15T12:00:00Z"


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch):
    monkeypatch.setattr(cond, "now", lambda: NEW)


def entry(type_, status, reason, message="", gen=1, ltt=OLD):
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": gen,
        "lastTransitionTime": ltt,
    }


def ready(status=True, reason=cond.AVAILABLE, message="up"):
    return Condition(cond.READY, status, reason, message)


def synced(status=True, reason=cond.RECONCILE_SUCCESS, message=""):
    return Condition(cond.SYNCED, status, reason, message)


# -- merge ---------------------------------------------------------------------------


def test_merge_adds_new_condition_with_now_and_generation():
    merged = cond.merge(None, [ready()], 3)
    assert merged == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Available",
            "message": "up",
            "observedGeneration": 3,
            "lastTransitionTime": NEW,
        }
    ]


def test_merge_keeps_transition_time_when_status_stays_even_if_reason_changes():
    current = [entry("Ready", "False", cond.CREATING, "creating")]
    merged = cond.merge(current, [Condition(cond.READY, False, cond.UNAVAILABLE, "x")], 2)
    assert merged[0]["lastTransitionTime"] == OLD
    assert merged[0]["reason"] == cond.UNAVAILABLE
    assert merged[0]["message"] == "x"
    assert merged[0]["observedGeneration"] == 2


@pytest.mark.parametrize(("before", "after"), [("False", True), ("True", False)])
def test_merge_moves_transition_time_when_status_flips(before, after):
    current = [entry("Ready", before, "Whatever")]
    merged = cond.merge(current, [ready(after)], 1)
    assert merged[0]["lastTransitionTime"] == NEW
    assert merged[0]["status"] == ("True" if after else "False")


def test_merge_fills_missing_transition_time_when_status_stays():
    current = [entry("Ready", "True", cond.AVAILABLE, ltt=None)]
    assert cond.merge(current, [ready()], 1)[0]["lastTransitionTime"] == NEW


def test_merge_does_not_mutate_input():
    current = [entry("Ready", "False", cond.CREATING), entry("Synced", "True", "X")]
    snapshot = copy.deepcopy(current)
    cond.merge(current, [ready(), synced(False, cond.RECONCILE_ERROR, "e")], 5)
    assert current == snapshot


def test_merge_keeps_other_conditions_and_sorts_ready_synced_then_alphabetical():
    current = [
        entry("Zeta", "True", "Z"),
        entry("Synced", "True", "S"),
        entry("Alpha", "False", "A"),
    ]
    merged = cond.merge(current, [ready()], 1)
    assert [c["type"] for c in merged] == ["Ready", "Synced", "Alpha", "Zeta"]
    assert merged[2] == entry("Alpha", "False", "A")


def test_ready_sorted_before_synced_whatever_the_update_order():
    merged = cond.merge(None, [synced(), ready()], 1)
    assert [c["type"] for c in merged] == ["Ready", "Synced"]
    merged = cond.merge([entry("Synced", "True", "S")], [ready()], 1)
    assert [c["type"] for c in merged] == ["Ready", "Synced"]


# -- status_patch ------------------------------------------------------------------


def settled_status(gen=4):
    return {
        "observedGeneration": gen,
        "externalName": "default-orders-12345678",
        "arn": "arn:aws:s3:::default-orders-12345678",
        "conditions": [
            entry("Ready", "True", cond.AVAILABLE, "up", gen=gen),
            entry("Synced", "True", cond.RECONCILE_SUCCESS, "", gen=gen),
        ],
    }


def test_status_patch_is_empty_when_nothing_changes():
    status = settled_status()
    patch = cond.status_patch(
        status,
        [ready(), synced()],
        4,
        {"externalName": status["externalName"], "arn": status["arn"]},
    )
    assert patch == {}


def test_status_patch_is_empty_when_conditions_stored_in_other_order():
    status = settled_status()
    status["conditions"].reverse()
    assert cond.status_patch(status, [ready(), synced()], 4, {}) == {}


def test_status_patch_is_empty_when_not_observed_and_nothing_changes():
    status = settled_status()
    assert cond.status_patch(status, [ready()], None, {"arn": status["arn"]}) == {}


def test_status_patch_with_no_updates_and_no_fields_is_empty():
    assert cond.status_patch(settled_status(), [], 4, {}) == {}
    assert cond.status_patch({}, [], None, {}) == {}


def test_status_patch_only_changed_fields():
    status = settled_status()
    patch = cond.status_patch(
        status, [ready(), synced()], 4, {"externalName": status["externalName"], "arn": "new"}
    )
    assert patch == {"arn": "new"}


def test_status_patch_new_field_and_none_for_absent_field():
    status = settled_status()
    patch = cond.status_patch(status, [], 4, {"connectionSecret": "s", "missing": None})
    assert patch == {"connectionSecret": "s"}


def test_status_patch_sets_observed_generation_and_condition_generations():
    status = settled_status(gen=4)
    patch = cond.status_patch(status, [ready(), synced()], 5, {})
    assert patch["observedGeneration"] == 5
    assert [c["observedGeneration"] for c in patch["conditions"]] == [5, 5]
    # status did not flip: the transition times stay
    assert [c["lastTransitionTime"] for c in patch["conditions"]] == [OLD, OLD]


def test_status_patch_observed_generation_without_updates():
    assert cond.status_patch(settled_status(gen=4), [], 5, {}) == {"observedGeneration": 5}


def test_status_patch_not_observed_keeps_generation():
    status = settled_status(gen=4)
    patch = cond.status_patch(
        status, [Condition(cond.READY, False, cond.DELETING, "bye")], None, {}
    )
    assert "observedGeneration" not in patch
    ready_entry = cond.find(patch["conditions"], cond.READY)
    assert ready_entry["observedGeneration"] == 4
    assert ready_entry["lastTransitionTime"] == NEW
    # the untouched condition is carried along unchanged (lists are replaced by a merge patch)
    assert cond.find(patch["conditions"], cond.SYNCED) == status["conditions"][1]


def test_status_patch_message_change_rewrites_conditions_only():
    status = settled_status()
    patch = cond.status_patch(status, [ready(message="different")], 4, {})
    assert set(patch) == {"conditions"}
    assert cond.find(patch["conditions"], cond.READY)["message"] == "different"
    assert cond.find(patch["conditions"], cond.READY)["lastTransitionTime"] == OLD


def test_status_patch_does_not_mutate_status():
    status = settled_status()
    snapshot = copy.deepcopy(status)
    cond.status_patch(status, [ready(False, cond.UNAVAILABLE, "down")], 9, {"arn": "x"})
    assert status == snapshot


def apply_merge_patch(status: dict, patch: dict) -> dict:
    result = copy.deepcopy(status)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = copy.deepcopy(value)
    return result


def test_property_applying_the_patch_makes_the_next_patch_empty() -> None:
    """A second reconcile that decides the same thing writes nothing."""
    rng = random.Random(1234)
    reasons = [cond.AVAILABLE, cond.CREATING, cond.RECONCILE_ERROR, cond.PAUSED]
    for _ in range(500):
        status: dict = {}
        if rng.random() < 0.7:
            status["observedGeneration"] = rng.randint(1, 3)
        if rng.random() < 0.7:
            status["conditions"] = [
                entry(t, rng.choice(["True", "False"]), rng.choice(reasons), gen=rng.randint(1, 3))
                for t in rng.sample(["Ready", "Synced", "Other"], rng.randint(0, 3))
            ]
        if rng.random() < 0.5:
            status["arn"] = rng.choice(["a", "b"])
        updates = [
            Condition(t, rng.random() < 0.5, rng.choice(reasons), rng.choice(["", "m"]))
            for t in rng.sample([cond.READY, cond.SYNCED], rng.randint(0, 2))
        ]
        generation = rng.choice([None, 1, 2, 3])
        fields = {"arn": rng.choice(["a", "b"])} if rng.random() < 0.5 else {}
        patch = cond.status_patch(status, updates, generation, fields)
        after = apply_merge_patch(status, patch)
        assert cond.status_patch(after, updates, generation, fields) == {}, (status, patch)
        # and every condition decided is now what the status shows
        for update in updates:
            assert not cond.changed(after, update)


# -- changed -----------------------------------------------------------------------


def test_changed_true_when_condition_missing():
    assert cond.changed({}, ready())
    assert cond.changed({"conditions": [entry("Synced", "True", "S")]}, ready())


def test_changed_false_when_same_even_if_generation_and_time_differ():
    status = {"conditions": [entry("Ready", "True", cond.AVAILABLE, "up", gen=1, ltt="t")]}
    assert not cond.changed(status, ready())


@pytest.mark.parametrize(
    "condition",
    [
        ready(status=False),
        ready(reason=cond.CREATING),
        ready(message="other"),
    ],
)
def test_changed_true_when_status_reason_or_message_differs(condition):
    status = {"conditions": [entry("Ready", "True", cond.AVAILABLE, "up")]}
    assert cond.changed(status, condition)


def test_find():
    conds = [entry("Ready", "True", "R"), entry("Synced", "False", "S")]
    assert cond.find(conds, "Synced")["reason"] == "S"
    assert cond.find(conds, "Other") is None
    assert cond.find(None, "Ready") is None


def test_condition_key():
    c = Condition(cond.READY, True, cond.AVAILABLE, "m")
    assert c.key() == ("Ready", True, "Available", "m")
    assert c.key() != Condition(cond.READY, False, cond.AVAILABLE, "m").key()
