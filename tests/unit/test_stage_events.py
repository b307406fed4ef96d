"""Stage events: a pass's own Events, plus one per state change of Ready or Synced; a change
in the cloud names who asked for it only where that is known for sure; no secret value in
any of them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.events import CLOUD_CHANGES, QUIET_REASONS, Events, status_patch
from provisioner.reconciler.failures import failure
from provisioner.reconciler.outcome import Event, Result

NS, NAME, UID = "team-a", "orders", "uid-orders"
ALICE = "alice@example.com"
VERIFIED = Settings(region="us-east-1", cluster_id="test", requested_by="verified")
UNVERIFIED = Settings(region="us-east-1", cluster_id="test")
PASSWORD = "Secret0Password0Value00000000000"


def body(conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {
            "namespace": NS,
            "name": NAME,
            "uid": UID,
            "generation": 2,
            "annotations": {annotation_keys.REQUESTED_BY: ALICE},
        },
        "spec": {},
        "status": {"conditions": conditions or [], **status},
    }


def parsed(b: dict[str, Any]) -> Resource:
    return kinds.parse(b, region="us-east-1", cluster_id="test")


def was(type_: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": 2,
    }


def emit(
    result: Result,
    before: list[dict[str, Any]] | None = None,
    settings: Settings = UNVERIFIED,
) -> list[tuple[dict[str, Any], Event]]:
    posted: list[tuple[dict[str, Any], Event]] = []
    b = body(before)
    Events(settings, lambda ref, event: posted.append((ref, event))).emit(b, parsed(b), result)
    return posted


def posted_of(result: Result, before: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for _, e in emit(result, before)]


def with_conditions(*conditions: cond.Condition) -> Result:
    return Result(conditions=list(conditions))


SYNCED_OK = cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS)
READY_OK = cond.Condition(cond.READY, True, cond.AVAILABLE, "q is available")


# -- Synced ------------------------------------------------------------------------------


def test_synced_true_is_news_only_after_false():
    before = [was(cond.SYNCED, False, cond.RECONCILE_ERROR, "throttled")]
    assert posted_of(with_conditions(SYNCED_OK), before) == [("Normal", cond.RECONCILE_SUCCESS)]


@pytest.mark.parametrize(
    "before",
    [
        None,  # a new resource: Synced=True is no recovery
        [was(cond.SYNCED, True, cond.RECONCILE_SUCCESS, "written: x; may lag")],
    ],
)
def test_synced_true_is_no_news_otherwise(before):
    assert posted_of(with_conditions(SYNCED_OK), before) == []


def test_synced_false_is_news_each_time_it_says_something_new():
    first = cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, "throttled")
    assert posted_of(with_conditions(first)) == [("Warning", cond.RECONCILE_ERROR)]
    same = [was(cond.SYNCED, False, cond.RECONCILE_ERROR, "throttled")]
    assert posted_of(with_conditions(first), same) == []
    other = cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, "timed out")
    assert posted_of(with_conditions(other), same) == [("Warning", cond.RECONCILE_ERROR)]


# -- Ready -------------------------------------------------------------------------------


def test_ready_is_news_on_a_status_change():
    before = [was(cond.READY, False, cond.CREATING, "creating q")]
    assert posted_of(with_conditions(READY_OK), before) == [("Normal", cond.AVAILABLE)]


def test_ready_is_news_on_a_reason_change():
    before = [was(cond.READY, False, cond.CREATING, "q is creating")]
    down = cond.Condition(cond.READY, False, cond.UNAVAILABLE, "q is storage-full")
    assert posted_of(with_conditions(down), before) == [("Warning", cond.UNAVAILABLE)]


def test_ready_is_no_news_when_only_its_wording_changes():
    before = [was(cond.READY, True, cond.AVAILABLE, "q is available")]
    reworded = cond.Condition(
        cond.READY, True, cond.AVAILABLE, "q is available; connection Secret s is written"
    )
    assert posted_of(with_conditions(reworded), before) == []
    creating = [was(cond.READY, False, cond.CREATING, "q is creating")]
    still = cond.Condition(cond.READY, False, cond.CREATING, "q is backing-up")
    assert posted_of(with_conditions(still), creating) == []


def test_a_first_ready_is_news():
    assert posted_of(with_conditions(READY_OK)) == [("Normal", cond.AVAILABLE)]


def test_only_ready_and_synced_make_events():
    result = with_conditions(
        cond.Condition(cond.DRIFTED, True, cond.DRIFT_REPORTED, "x"),
        cond.Condition(cond.EXPIRING, True, cond.EXPIRES_SOON, "soon"),
    )
    assert posted_of(result) == []


# -- Normal or Warning -------------------------------------------------------------------


@pytest.mark.parametrize("reason", sorted(QUIET_REASONS))
def test_quiet_reasons_are_normal(reason):
    assert posted_of(with_conditions(cond.Condition(cond.READY, False, reason, "m"))) == [
        ("Normal", reason)
    ]


def test_the_quiet_reasons():
    assert QUIET_REASONS == {
        cond.CREATING,
        cond.DELETING,
        cond.WAITING_FOR_DEPENDENCY,
        cond.PLAN_ONLY,
    }


@pytest.mark.parametrize("reason", [cond.UNAVAILABLE, cond.NAME_CONFLICT, cond.INVALID_SPEC])
def test_other_false_conditions_are_warnings(reason):
    assert posted_of(with_conditions(cond.Condition(cond.SYNCED, False, reason, "m"))) == [
        ("Warning", reason)
    ]


def test_an_event_without_a_message_says_its_reason():
    [(_, event)] = emit(with_conditions(cond.Condition(cond.SYNCED, False, cond.PAUSED)))
    assert event.message == cond.PAUSED


# -- the pass's own Events and who asked -----------------------------------------------------


def test_own_events_come_first_in_order_then_state_changes():
    result = Result(
        conditions=[READY_OK],
        events=[Event("Normal", "Created", "created q"), Event("Normal", "SecretWritten", "s")],
    )
    assert posted_of(result) == [
        ("Normal", "Created"),
        ("Normal", "SecretWritten"),
        ("Normal", cond.AVAILABLE),
    ]


def test_events_are_posted_with_a_reference_not_the_body():
    posted = emit(Result(events=[Event("Normal", "Created", "created q")]))
    assert posted[0][0] == {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID},
    }


def test_the_requester_is_named_only_when_verified():
    result = Result(events=[Event("Normal", "Created", "created q")])
    [(_, verified)] = emit(result, settings=VERIFIED)
    assert verified.message == f"created q (requested by {ALICE})"
    [(_, unverified)] = emit(result, settings=UNVERIFIED)
    assert unverified.message == "created q"


def test_only_cloud_changes_name_the_requester():
    result = Result(
        events=[Event("Normal", "SecretWritten", "restored"), Event("Warning", "Drifted", "x")],
        conditions=[READY_OK],
    )
    posted = [e.message for _, e in emit(result, settings=VERIFIED)]
    assert posted == ["restored", f"x (requested by {ALICE})", "q is available"]
    assert "SecretWritten" not in CLOUD_CHANGES and "Drifted" in CLOUD_CHANGES


def test_no_annotation_names_nobody():
    b = body()
    b["metadata"]["annotations"] = {}
    event = Events(VERIFIED, lambda *_: None).attributed(parsed(b), Event("Normal", "Created", "c"))
    assert event == Event("Normal", "Created", "c")


def test_a_cloud_change_is_logged_with_its_fields(caplog):
    b = body()
    with caplog.at_level(logging.INFO, logger="provisioner.reconciler.events"):
        Events(VERIFIED, lambda *_: None).attributed(parsed(b), Event("Normal", "Deleted", "d"))
        Events(UNVERIFIED, lambda *_: None).attributed(parsed(b), Event("Normal", "Deleted", "d"))
    verified, unverified = caplog.records
    assert verified.requested_by == ALICE
    assert unverified.requested_by == ""
    assert ALICE not in unverified.getMessage()
    for record in (verified, unverified):
        assert record.resource_kind == "Queue"
        assert record.resource_namespace == NS
        assert record.resource_name == NAME
        assert record.event_reason == "Deleted"


def test_no_secret_value_in_any_event():
    b = body()
    exc = RuntimeError(f"the endpoint rejected MasterUserPassword={PASSWORD}")
    result = failure(parsed(b), exc, 0)
    result.events.append(Event("Normal", "PasswordChanged", "master password rotated on request"))
    posted = emit(result, settings=VERIFIED)
    assert posted  # the failure itself is news
    assert all(PASSWORD not in e.message for _, e in posted)


def test_a_cloud_error_shows_the_clouds_words():
    result = failure(parsed(body()), errors.RetryableError("Rate exceeded", "Throttling"), 0)
    [(_, event)] = emit(result)
    assert event == Event(
        "Warning", cond.RECONCILE_ERROR, "cloud call failed, will retry: Throttling: Rate exceeded"
    )


# -- status_patch ------------------------------------------------------------------------


def test_status_patch_is_empty_when_nothing_changed():
    before = [
        was(cond.READY, True, cond.AVAILABLE, "q is available"),
        was(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
    ]
    b = body(before, observedGeneration=2, arn="arn:q")
    result = Result(conditions=[READY_OK, SYNCED_OK], fields={"arn": "arn:q"})
    assert status_patch(parsed(b), result) == {}


def test_status_patch_moves_the_generation_only_for_a_pass_that_handled_it():
    b = body([], observedGeneration=1)
    handled = status_patch(parsed(b), Result(conditions=[SYNCED_OK]))
    assert handled["observedGeneration"] == 2
    not_handled = status_patch(parsed(b), Result(conditions=[SYNCED_OK], for_generation=False))
    assert "observedGeneration" not in not_handled
    assert not_handled["conditions"][0]["observedGeneration"] == 1
