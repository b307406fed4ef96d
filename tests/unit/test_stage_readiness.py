"""Stage readiness: what a converged pass reports (creating, not available, written but not
applied, Ready) and when it looks again; what differs by kind comes from the kind contract."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler import outcome, readiness
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_BASE,
    WAIT_CAP,
    Event,
    Verdict,
)
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import EVERYTHING_REQUESTED, Requested

SPECS = {
    "DatabaseInstance": {"engine": "postgres", "instanceClass": "db.t3.micro"},
    "Queue": {},
}
LATE = 40  # a retry past every cap
VIS = "spec.visibilityTimeoutSeconds"
DELAY = "spec.delaySeconds"


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)


def resource(kind: str = "Queue", annotations: dict[str, str] | None = None) -> Resource:
    body = {
        "kind": kind,
        "metadata": {
            "namespace": "ns",
            "name": "orders",
            "uid": "uid-orders",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": SPECS[kind],
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def progress(
    kind: str = "Queue",
    retry: int = 0,
    requested: Requested = EVERYTHING_REQUESTED,
    annotations: dict[str, str] | None = None,
) -> Progress:
    r = resource(kind, annotations)
    return Progress(r, kinds.descriptor(kind), retry, requested)


def shown(result: Any) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in result.conditions}


def message(result: Any, type_: str) -> str:
    return next(c.message for c in result.conditions if c.type == type_)


# -- creating / not available --------------------------------------------------------------


def test_creating():
    p = progress(retry=LATE)
    p.event("Normal", "Created", "created")
    result = readiness.creating(p)
    assert shown(result) == {cond.READY: (False, cond.CREATING)}
    assert result.fields == {"externalName": p.resource.external_name}
    assert result.events == [Event("Normal", "Created", "created")]
    assert result.verdict is Verdict.WAITING
    assert result.requeue_after == WAIT_CAP


@pytest.mark.parametrize(
    ("kind", "state", "reason"),
    [
        ("DatabaseInstance", "creating", cond.CREATING),
        ("DatabaseInstance", "", cond.CREATING),
        ("DatabaseInstance", "backing-up", cond.UNAVAILABLE),
        ("DatabaseInstance", "storage-full", cond.UNAVAILABLE),
        # A queue has no "creating" state of its own: a word it does not know is trouble.
        ("Queue", "creating", cond.UNAVAILABLE),
        ("Queue", "", cond.CREATING),
    ],
)
def test_a_kinds_creating_states_decide_creating_or_unavailable(kind, state, reason):
    p = progress(kind)
    result = readiness.not_available(p, Observation(exists=True, available=False, state=state))
    assert shown(result) == {
        cond.READY: (False, reason),
        cond.SYNCED: (True, cond.RECONCILE_SUCCESS),
    }
    assert result.verdict is Verdict.WAITING
    assert message(result, cond.READY) == f"{p.resource.external_name} is {state or 'not ready'}"


def test_the_creating_states_come_from_the_kind_contract():
    assert "creating" in kinds.descriptor("DatabaseInstance").creating_states
    assert "creating" not in kinds.descriptor("Queue").creating_states


def test_not_available_keeps_what_the_pass_did_and_waits():
    p = progress("DatabaseInstance", retry=LATE)
    p.fields["arn"] = "arn:x"
    p.conditions.append(cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT))
    p.event("Warning", "Drifted", "corrected")
    result = readiness.not_available(p, Observation(exists=True, available=False, state="x"))
    assert result.fields == {"arn": "arn:x"}
    assert shown(result)[cond.DRIFTED] == (False, cond.NO_DRIFT)
    assert [e.reason for e in result.events] == ["Drifted"]
    assert result.requeue_after == WAIT_CAP
    assert readiness.not_available(progress(), Observation(exists=True)).requeue_after == WAIT_BASE


# -- waiting -------------------------------------------------------------------------------


def test_a_resource_going_away_is_not_available():
    obs = Observation(exists=True, available=True, deleting=True, state="deleting")
    result = readiness.waiting(progress("DatabaseInstance"), obs)
    assert result is not None
    assert shown(result)[cond.READY] == (False, cond.UNAVAILABLE)


def test_a_change_not_shown_yet_is_not_applied():
    p = progress(retry=LATE)
    obs = Observation(exists=True, diffs=[FieldDiff(VIS, 30, 60)])
    result = readiness.waiting(p, obs)
    assert result is not None
    assert shown(result) == {
        cond.READY: (True, cond.AVAILABLE),
        cond.SYNCED: (False, cond.RECONCILE_ERROR),
    }
    assert message(result, cond.SYNCED) == f"the cloud has not applied: {VIS}: 30 -> 60"
    assert result.verdict is Verdict.NOT_APPLIED
    assert result.requeue_after == RETRY_CAP


def test_drift_left_by_report_only_does_not_hold_readiness():
    p = progress(
        requested=Requested(frozenset({VIS})), annotations={annotation_keys.DRIFT_POLICY: "report"}
    )
    assert readiness.waiting(p, Observation(exists=True, diffs=[FieldDiff(DELAY, 9, 0)])) is None
    # A requested change the cloud does not show is pending whatever the policy.
    pending = readiness.waiting(p, Observation(exists=True, diffs=[FieldDiff(VIS, 30, 60)]))
    assert pending is not None and pending.verdict is Verdict.NOT_APPLIED


def test_serving_in_line_with_the_spec_waits_for_nothing():
    assert readiness.waiting(progress(), Observation(exists=True)) is None


# -- ready -------------------------------------------------------------------------------


def test_ready():
    p = progress()
    p.fields["arn"] = "arn:x"
    result = readiness.ready(p, Observation(exists=True), None, False)
    assert shown(result) == {
        cond.READY: (True, cond.AVAILABLE),
        cond.SYNCED: (True, cond.RECONCILE_SUCCESS),
    }
    r = p.resource
    assert message(result, cond.READY) == (
        f"{r.external_name} is available; connection Secret {r.secret_name} is written"
    )
    assert message(result, cond.SYNCED) == ""
    assert result.requeue_after is None
    assert result.verdict is Verdict.DONE
    assert result.fields == {"arn": "arn:x"}


def test_what_the_cloud_is_still_applying_shows_in_readys_message():
    obs = Observation(exists=True, applying="allocatedStorageGiB: 30")
    result = readiness.ready(progress("DatabaseInstance"), obs, None, False)
    assert message(result, cond.READY).endswith("; the cloud is applying: allocatedStorageGiB: 30")
    assert result.requeue_after is None


def test_a_write_settling_looks_again():
    p = progress(retry=LATE)
    result = readiness.ready(p, Observation(exists=True, settling=[VIS, DELAY]), None, False)
    assert shown(result)[cond.SYNCED] == (True, cond.RECONCILE_SUCCESS)
    assert message(result, cond.SYNCED) == (
        f"written: {VIS}, {DELAY}; the cloud may show the previous value for up to 60 s"
    )
    assert result.requeue_after == WAIT_CAP
    assert result.verdict is Verdict.DONE


@pytest.mark.parametrize(("retry", "cap"), [(True, RETRY_CAP), (False, CREDENTIALS_RETRY_CAP)])
def test_an_access_problem_blocks_with_its_cap(retry, cap):
    problem = cond.Condition(cond.SYNCED, False, cond.SERVICE_ACCOUNT_NOT_FOUND, "sa missing")
    result = readiness.ready(progress(retry=LATE), Observation(exists=True), problem, retry)
    assert shown(result) == {
        cond.READY: (True, cond.AVAILABLE),  # the resource itself serves
        cond.SYNCED: (False, cond.SERVICE_ACCOUNT_NOT_FOUND),
    }
    assert message(result, cond.SYNCED) == "sa missing"
    assert result.verdict is Verdict.ACCESS_BLOCKED
    assert result.requeue_after == cap


def test_an_access_problem_while_a_write_settles_looks_again_at_the_sooner():
    problem = cond.Condition(cond.SYNCED, False, cond.ACCESS_CONFLICT, "taken")
    obs = Observation(exists=True, settling=[VIS])
    result = readiness.ready(progress(retry=LATE), obs, problem, False)
    assert result.requeue_after == WAIT_CAP
    assert result.verdict is Verdict.ACCESS_BLOCKED
    # Early on the problem's own backoff is the sooner one.
    early = readiness.ready(progress(retry=0), obs, problem, True)
    assert early.requeue_after == outcome.RETRY_BASE


def test_ready_keeps_the_passs_conditions_and_events_after_its_own():
    p = progress()
    p.conditions.append(cond.Condition(cond.DRIFTED, False, cond.DRIFT_CORRECTED, "x"))
    p.event("Normal", "Updated", "updated x")
    result = readiness.ready(p, Observation(exists=True), None, False)
    assert [c.type for c in result.conditions] == [cond.READY, cond.SYNCED, cond.DRIFTED]
    assert [e.reason for e in result.events] == ["Updated"]
